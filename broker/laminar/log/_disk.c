/* The disk writes of a broker's rounds, run by threads that never hold the GIL
 * (`laminar.server.disk_threads`).
 *
 * A job is one file's work of a round: writes (an offset and buffers each, with pwritev,
 * finished if short) and then, if asked, an fdatasync. Python threads running the same work
 * took the GIL to start each job and to report it done, and a busy event loop handed it over
 * only at its switch interval; these threads take it never. A finished job is queued for
 * `collect` and counted on an eventfd the event loop watches.
 *
 * A sync may first write back a range of the file in chunks, each waited for before the next
 * starts (sync_file_range): a journal checkpoint's log syncs, whose megabytes would otherwise
 * reach the disk's queue at once, in front of the rounds' small syncs (bench/RESULTS.md,
 * issue 22, twenty-seventh and twenty-eighth sittings).
 *
 * The caller keeps each job's descriptor open until it is collected. Buffers are held (as
 * Py_buffer views) from `submit` to `collect`, and released there, with the GIL.
 */

#define _GNU_SOURCE /* sync_file_range */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_THREADS 64
#define MAX_WRITES (1 << 20)
#define MAX_IOV 1024 /* IOV_MAX on Linux */

typedef struct Job {
    struct Job *next;
    long long token;
    int fd;
    int sync;
    long long writeback_from, writeback_to, chunk; /* before the fdatasync, if from < to */
    Py_ssize_t writes;     /* how many writes */
    long long *offsets;    /* [writes] */
    Py_ssize_t *counts;    /* [writes]: buffers of each write */
    struct iovec *iov;     /* every write's buffers, in order */
    Py_buffer *views;      /* [buffers] */
    Py_ssize_t buffers;
    int error;             /* errno of the step that failed, else 0 */
    Py_ssize_t failed;     /* the write that failed, `writes` for the fdatasync, else -1 */
} Job;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;
    pthread_cond_t wake;
    Job *queue_head, *queue_tail; /* submitted, not started */
    Job *done_head, *done_tail;   /* finished, not collected */
    int efd;
    int stopping;
    int threads_wanted;
    int threads_started;
    pthread_t threads[MAX_THREADS];
    Py_ssize_t outstanding; /* submitted and not collected */
} Pool;

static void job_free(Job *job) {
    for (Py_ssize_t i = 0; i < job->buffers; i++) {
        PyBuffer_Release(&job->views[i]);
    }
    PyMem_RawFree(job->views);
    PyMem_RawFree(job->iov);
    PyMem_RawFree(job->counts);
    PyMem_RawFree(job->offsets);
    PyMem_RawFree(job);
}

/* pwritev all of `iov` at `offset`, resuming after short writes; 0 or an errno. */
static int write_all(int fd, struct iovec *iov, Py_ssize_t count, long long offset) {
    while (count > 0) {
        int batch = count > MAX_IOV ? MAX_IOV : (int)count;
        ssize_t n = pwritev(fd, iov, batch, (off_t)offset);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return errno;
        }
        if (n == 0) {
            return EIO;
        }
        offset += n;
        while (count > 0 && (size_t)n >= iov->iov_len) {
            n -= (ssize_t)iov->iov_len;
            iov++;
            count--;
        }
        if (count > 0 && n > 0) {
            iov->iov_base = (char *)iov->iov_base + n;
            iov->iov_len -= (size_t)n;
        }
    }
    return 0;
}

/* Write back [from, to) of `fd` in `chunk`-byte pieces, each waited for; 0 or an errno. A
 * file system without sync_file_range leaves it all to the fdatasync. An error fails the sync:
 * sync_file_range's wait takes a writeback error off the descriptor (as fdatasync does), so
 * the fdatasync after it would not report it again. */
static int write_back(int fd, long long from, long long to, long long chunk) {
    for (long long offset = from; offset < to; offset += chunk) {
        long long length = to - offset < chunk ? to - offset : chunk;
        unsigned int flags = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                             SYNC_FILE_RANGE_WAIT_AFTER;
        while (sync_file_range(fd, (off_t)offset, (off_t)length, flags) != 0) {
            if (errno == EINVAL || errno == ENOSYS || errno == ESPIPE) {
                return 0;
            }
            if (errno != EINTR) {
                return errno;
            }
        }
    }
    return 0;
}

static void job_run(Job *job) {
    struct iovec *iov = job->iov;
    for (Py_ssize_t i = 0; i < job->writes; i++) {
        int error = write_all(job->fd, iov, job->counts[i], job->offsets[i]);
        if (error) {
            job->error = error;
            job->failed = i;
            return;
        }
        iov += job->counts[i];
    }
    if (job->sync) {
        int error = write_back(job->fd, job->writeback_from, job->writeback_to, job->chunk);
        if (error) {
            job->error = error;
            job->failed = job->writes;
            return;
        }
        while (fdatasync(job->fd) != 0) {
            if (errno != EINTR) {
                job->error = errno;
                job->failed = job->writes;
                return;
            }
        }
    }
}

/* Append `job` to the queue from `*head` to `*tail` (the pool's lock held). */
static void queue_push(Job **head, Job **tail, Job *job) {
    job->next = NULL;
    if (*tail) {
        (*tail)->next = job;
    } else {
        *head = job;
    }
    *tail = job;
}

static void *worker(void *arg) {
    Pool *pool = (Pool *)arg;
    for (;;) {
        pthread_mutex_lock(&pool->lock);
        while (pool->queue_head == NULL && !pool->stopping) {
            pthread_cond_wait(&pool->wake, &pool->lock);
        }
        Job *job = pool->queue_head;
        if (job == NULL) { /* stopping, and every job handed over has run */
            pthread_mutex_unlock(&pool->lock);
            return NULL;
        }
        pool->queue_head = job->next;
        if (pool->queue_head == NULL) {
            pool->queue_tail = NULL;
        }
        pthread_mutex_unlock(&pool->lock);

        job_run(job);

        pthread_mutex_lock(&pool->lock);
        queue_push(&pool->done_head, &pool->done_tail, job);
        pthread_mutex_unlock(&pool->lock);
        uint64_t one = 1;
        ssize_t ignored = write(pool->efd, &one, sizeof one); /* only fails when full */
        (void)ignored;
    }
}

static int Pool_init(Pool *self, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"threads", NULL};
    int threads;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i", keywords, &threads)) {
        return -1;
    }
    if (threads < 1 || threads > MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be 1 to %d", MAX_THREADS);
        return -1;
    }
    if (self->efd >= 0) {
        PyErr_SetString(PyExc_RuntimeError, "a pool is initialized once");
        return -1;
    }
    self->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->threads_wanted = threads;
    return 0;
}

static PyObject *Pool_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    (void)args;
    (void)kwds;
    Pool *self = (Pool *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    pthread_mutex_init(&self->lock, NULL);
    pthread_cond_init(&self->wake, NULL);
    self->efd = -1;
    return (PyObject *)self;
}

/* Start the pool's threads, each made SCHED_BATCH before this returns: a job handed over must
 * not preempt the event loop's thread that handed it (CFS and EEVDF let a woken SCHED_NORMAL
 * thread preempt its waker); the scheduler runs it on an idle CPU, or when the loop's thread
 * waits. Set here, not by each thread on its start, so that no thread of a started pool is
 * still SCHED_NORMAL when a job is handed over (a thread not yet scheduled had not set it).
 * glibc's thread attributes refuse SCHED_BATCH. Best effort: a refusal leaves the thread as
 * it is. */
static int start_threads(Pool *self) {
    struct sched_param batch = {0};
    while (self->threads_started < self->threads_wanted) {
        pthread_t *thread = &self->threads[self->threads_started];
        int error = pthread_create(thread, NULL, worker, self);
        if (error) {
            errno = error;
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        (void)pthread_setschedparam(*thread, SCHED_BATCH, &batch);
        self->threads_started++;
    }
    return 0;
}

/* submit(token, fd, writes, sync, writeback_from=0, writeback_to=0, chunk=0): writes is a
 * sequence of (offset, sequence of buffers). */
static PyObject *Pool_submit(Pool *self, PyObject *args) {
    long long token, writeback_from = 0, writeback_to = 0, chunk = 0;
    int fd, sync;
    PyObject *writes;
    if (!PyArg_ParseTuple(args, "LiOp|LLL", &token, &fd, &writes, &sync, &writeback_from,
                          &writeback_to, &chunk)) {
        return NULL;
    }
    if (writeback_from < writeback_to && (writeback_from < 0 || chunk <= 0)) {
        PyErr_SetString(PyExc_ValueError, "a write-back needs a start >= 0 and a chunk > 0");
        return NULL;
    }
    if (self->efd < 0 || self->stopping) {
        PyErr_SetString(PyExc_RuntimeError, "the pool is closed");
        return NULL;
    }
    if (fd < 0) {
        PyErr_SetString(PyExc_ValueError, "a negative descriptor");
        return NULL;
    }
    PyObject *outer = PySequence_Fast(writes, "writes must be a sequence");
    if (outer == NULL) {
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(outer);
    Job *job = PyMem_RawCalloc(1, sizeof(Job));
    PyObject **parts_of = count ? PyMem_RawCalloc((size_t)count, sizeof(PyObject *)) : NULL;
    if (job == NULL || (count && parts_of == NULL) || count > MAX_WRITES) {
        PyMem_RawFree(job);
        PyMem_RawFree(parts_of);
        Py_DECREF(outer);
        return count > MAX_WRITES ? PyErr_Format(PyExc_ValueError, "too many writes")
                                  : PyErr_NoMemory();
    }
    job->token = token;
    job->fd = fd;
    job->sync = sync;
    job->writeback_from = writeback_from;
    job->writeback_to = writeback_to;
    job->chunk = chunk;
    job->failed = -1;
    Py_ssize_t total = 0;
    int ok = 1;
    if (count) {
        job->offsets = PyMem_RawCalloc((size_t)count, sizeof(long long));
        job->counts = PyMem_RawCalloc((size_t)count, sizeof(Py_ssize_t));
        ok = job->offsets != NULL && job->counts != NULL;
        if (!ok) {
            PyErr_NoMemory();
        }
    }
    for (Py_ssize_t i = 0; ok && i < count; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(outer, i);
        PyObject *buffers;
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "LO", &job->offsets[i], &buffers)) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "a write is (offset, buffers)");
            }
            ok = 0;
            break;
        }
        if (job->offsets[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "a negative offset");
            ok = 0;
            break;
        }
        parts_of[i] = PySequence_Fast(buffers, "buffers must be a sequence");
        if (parts_of[i] == NULL) {
            ok = 0;
            break;
        }
        job->counts[i] = PySequence_Fast_GET_SIZE(parts_of[i]);
        total += job->counts[i];
    }
    if (ok && total) {
        job->iov = PyMem_RawCalloc((size_t)total, sizeof(struct iovec));
        job->views = PyMem_RawCalloc((size_t)total, sizeof(Py_buffer));
        if (job->iov == NULL || job->views == NULL) {
            PyErr_NoMemory();
            ok = 0;
        }
    }
    for (Py_ssize_t i = 0; ok && i < count; i++) {
        for (Py_ssize_t j = 0; j < job->counts[i]; j++) {
            PyObject *part = PySequence_Fast_GET_ITEM(parts_of[i], j);
            Py_buffer *view = &job->views[job->buffers];
            if (PyObject_GetBuffer(part, view, PyBUF_SIMPLE) != 0) {
                ok = 0;
                break;
            }
            job->iov[job->buffers].iov_base = view->buf;
            job->iov[job->buffers].iov_len = (size_t)view->len;
            job->buffers++;
        }
    }
    job->writes = count;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_XDECREF(parts_of[i]);
    }
    PyMem_RawFree(parts_of);
    Py_DECREF(outer);
    if (!ok) {
        job_free(job);
        return NULL;
    }
    if (start_threads(self) != 0) {
        job_free(job);
        return NULL;
    }
    pthread_mutex_lock(&self->lock);
    queue_push(&self->queue_head, &self->queue_tail, job);
    self->outstanding++;
    pthread_cond_signal(&self->wake);
    pthread_mutex_unlock(&self->lock);
    Py_RETURN_NONE;
}

/* collect() -> [(token, errno, failed step)]: the jobs finished since the last call. */
static PyObject *Pool_collect(Pool *self, PyObject *Py_UNUSED(ignored)) {
    if (self->efd >= 0) {
        uint64_t count;
        ssize_t ignored = read(self->efd, &count, sizeof count); /* EAGAIN: none counted */
        (void)ignored;
    }
    pthread_mutex_lock(&self->lock);
    Job *job = self->done_head;
    self->done_head = self->done_tail = NULL;
    pthread_mutex_unlock(&self->lock);
    PyObject *result = PyList_New(0);
    while (job != NULL) {
        Job *next = job->next;
        if (result != NULL) {
            PyObject *item = Py_BuildValue("(Lin)", job->token, job->error, job->failed);
            if (item == NULL || PyList_Append(result, item) != 0) {
                Py_CLEAR(result);
            }
            Py_XDECREF(item);
        }
        self->outstanding--;
        job_free(job);
        job = next;
    }
    return result;
}

static PyObject *Pool_fileno(Pool *self, PyObject *Py_UNUSED(ignored)) {
    if (self->efd < 0) {
        PyErr_SetString(PyExc_ValueError, "the pool is closed");
        return NULL;
    }
    return PyLong_FromLong(self->efd);
}

static PyObject *Pool_outstanding(Pool *self, PyObject *Py_UNUSED(ignored)) {
    return PyLong_FromSsize_t(self->outstanding);
}

/* Run every job handed over, then stop the threads (joined without the GIL). The jobs they
 * finished stay for `collect`. */
static void pool_stop(Pool *self) {
    pthread_mutex_lock(&self->lock);
    self->stopping = 1;
    pthread_cond_broadcast(&self->wake);
    pthread_mutex_unlock(&self->lock);
    int started = self->threads_started;
    self->threads_started = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < started; i++) {
        pthread_join(self->threads[i], NULL);
    }
    Py_END_ALLOW_THREADS
}

static PyObject *Pool_stop(Pool *self, PyObject *Py_UNUSED(ignored)) {
    pool_stop(self);
    Py_RETURN_NONE;
}

static void Pool_dealloc(Pool *self) {
    PyObject *type, *value, *traceback; /* an exception being raised may be what freed it */
    PyErr_Fetch(&type, &value, &traceback);
    pool_stop(self);
    PyObject *left = Pool_collect(self, NULL);
    Py_XDECREF(left);
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
    if (self->efd >= 0) {
        close(self->efd);
    }
    pthread_cond_destroy(&self->wake);
    pthread_mutex_destroy(&self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Pool_methods[] = {
    {"submit", (PyCFunction)Pool_submit, METH_VARARGS,
     "submit(token, fd, writes, sync, writeback_from=0, writeback_to=0, chunk=0): run (offset, "
     "buffers) writes on fd, then fdatasync it if sync (first writing back [writeback_from, "
     "writeback_to) in chunk-byte pieces, each waited for), in a thread."},
    {"collect", (PyCFunction)Pool_collect, METH_NOARGS,
     "collect() -> [(token, errno, failed step)]: the jobs finished since the last call."},
    {"fileno", (PyCFunction)Pool_fileno, METH_NOARGS,
     "fileno(): an eventfd, readable once a job has finished."},
    {"outstanding", (PyCFunction)Pool_outstanding, METH_NOARGS,
     "outstanding(): jobs submitted and not yet collected."},
    {"stop", (PyCFunction)Pool_stop, METH_NOARGS,
     "stop(): run every job handed over, then stop the threads; submit refuses after."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "laminar.log._disk.Pool",
    .tp_basicsize = sizeof(Pool),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Threads without the GIL running file writes and fdatasyncs.",
    .tp_new = Pool_new,
    .tp_init = (initproc)Pool_init,
    .tp_dealloc = (destructor)Pool_dealloc,
    .tp_methods = Pool_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_disk", "Disk writes off the GIL (see the source).", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__disk(void) {
    if (PyType_Ready(&PoolType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&PoolType);
    if (PyModule_AddObject(m, "Pool", (PyObject *)&PoolType) < 0) {
        Py_DECREF(&PoolType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
