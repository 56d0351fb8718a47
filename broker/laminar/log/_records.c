/* The records-section walker of a record batch (docs/formats.md §1), in C.
 *
 * A broker checks every record's framing at append: the lengths inside the records must stay
 * within the payload, the records must fill it exactly, header names must be UTF-8 and the
 * timestamps must lie in the valid range and agree with the batch header. That is a walk over
 * every record, which the broker's hot path cannot afford in Python; this module does it at
 * memory speed. `laminar.log.records.records_problem_py` is the reference with the very same
 * semantics and messages (tests/log/test_records.py compares the two on random and mutated
 * batches).
 *
 *     records_problem(payload, record_count, first_timestamp_ms, max_timestamp_ms) -> str | None
 *
 * `payload` is any C-contiguous buffer (bytes, bytearray, memoryview). None means the records
 * section is valid; otherwise the first problem found, in words. Every read is bounds-checked
 * against the buffer's length before it is made: whatever the input, nothing outside the
 * buffer is ever read. The GIL is released while a large payload is walked.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define RECORD_HEADER_BYTES 14 /* i32 delta, i32 key_bytes, i32 value_bytes, u16 header_count */
#define HEADER_FIELD_BYTES 6   /* u16 name_bytes, u32 value_bytes */
#define MIN_TIMESTAMP_MS 0LL
#define MAX_TIMESTAMP_MS 253402300799999LL /* 9999-12-31T23:59:59.999Z */
#define NOGIL_BYTES (64 * 1024)            /* walk payloads this large without the GIL */

enum problem_code {
    OK = 0,
    NO_RECORDS,
    FIRST_TIMESTAMP,
    RECORD_HEADER_PAST,
    FIRST_DELTA,
    TIMESTAMP,
    KEY_LENGTH,
    KEY_PAST,
    VALUE_LENGTH,
    VALUE_PAST,
    HEADER_PAST,
    NAME_PAST,
    NAME_UTF8,
    HEADER_VALUE_PAST,
    TRAILING,
    MAX_TIMESTAMP,
};

/* What went wrong and where: enough to word the message once the GIL is held again. */
typedef struct {
    enum problem_code code;
    Py_ssize_t record;
    Py_ssize_t header;
    long long value;
    Py_ssize_t pos;
} problem;

static inline uint16_t read_u16(const unsigned char *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t read_u32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static inline int32_t read_i32(const unsigned char *p) {
    return (int32_t)read_u32(p);
}

/* Strict UTF-8 as Python's decoder takes it: no overlong forms, no surrogates, nothing past
 * U+10FFFF. */
static int valid_utf8(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i += 1;
            continue;
        }
        Py_ssize_t need;
        unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            need = 2;
            if (c == 0xE0) {
                lo = 0xA0;
            } else if (c == 0xED) {
                hi = 0x9F;
            }
        } else if (c >= 0xF0 && c <= 0xF4) {
            need = 3;
            if (c == 0xF0) {
                lo = 0x90;
            } else if (c == 0xF4) {
                hi = 0x8F;
            }
        } else {
            return 0;
        }
        if (n - i - 1 < need) {
            return 0;
        }
        if (s[i + 1] < lo || s[i + 1] > hi) {
            return 0;
        }
        for (Py_ssize_t k = 2; k <= need; k++) {
            if (s[i + k] < 0x80 || s[i + k] > 0xBF) {
                return 0;
            }
        }
        i += need + 1;
    }
    return 1;
}

static void walk(const unsigned char *p, Py_ssize_t n, Py_ssize_t count, long long first,
                 long long max_ts, problem *out) {
    out->code = OK;
    if (count < 1) {
        out->code = NO_RECORDS;
        out->value = count;
        return;
    }
    if (first < MIN_TIMESTAMP_MS || first > MAX_TIMESTAMP_MS) {
        out->code = FIRST_TIMESTAMP;
        out->value = first;
        return;
    }
    Py_ssize_t pos = 0;
    long long largest = first;
    for (Py_ssize_t i = 0; i < count; i++) {
        out->record = i;
        if (n - pos < RECORD_HEADER_BYTES) {
            out->code = RECORD_HEADER_PAST;
            out->pos = pos;
            return;
        }
        const unsigned char *r = p + pos;
        int32_t delta = read_i32(r);
        int32_t key_bytes = read_i32(r + 4);
        int32_t value_bytes = read_i32(r + 8);
        uint16_t header_count = read_u16(r + 12);
        pos += RECORD_HEADER_BYTES;
        if (i == 0 && delta != 0) {
            out->code = FIRST_DELTA;
            out->value = delta;
            return;
        }
        /* first is within [0, MAX_TIMESTAMP_MS]: adding an i32 cannot overflow */
        long long ts = first + (long long)delta;
        if (ts < MIN_TIMESTAMP_MS || ts > MAX_TIMESTAMP_MS) {
            out->code = TIMESTAMP;
            out->value = ts;
            return;
        }
        if (ts > largest) {
            largest = ts;
        }
        if (key_bytes < -1) {
            out->code = KEY_LENGTH;
            out->value = key_bytes;
            return;
        }
        if (key_bytes > 0) {
            if ((Py_ssize_t)key_bytes > n - pos) {
                out->code = KEY_PAST;
                out->value = key_bytes;
                out->pos = pos;
                return;
            }
            pos += key_bytes;
        }
        if (value_bytes < -1) {
            out->code = VALUE_LENGTH;
            out->value = value_bytes;
            return;
        }
        if (value_bytes > 0) {
            if ((Py_ssize_t)value_bytes > n - pos) {
                out->code = VALUE_PAST;
                out->value = value_bytes;
                out->pos = pos;
                return;
            }
            pos += value_bytes;
        }
        for (Py_ssize_t h = 0; h < header_count; h++) {
            out->header = h;
            if (n - pos < HEADER_FIELD_BYTES) {
                out->code = HEADER_PAST;
                out->pos = pos;
                return;
            }
            Py_ssize_t name_bytes = read_u16(p + pos);
            Py_ssize_t field_bytes = (Py_ssize_t)read_u32(p + pos + 2);
            pos += HEADER_FIELD_BYTES;
            if (name_bytes > n - pos) {
                out->code = NAME_PAST;
                out->value = name_bytes;
                out->pos = pos;
                return;
            }
            if (!valid_utf8(p + pos, name_bytes)) {
                out->code = NAME_UTF8;
                return;
            }
            pos += name_bytes;
            if (field_bytes > n - pos) {
                out->code = HEADER_VALUE_PAST;
                out->value = field_bytes;
                out->pos = pos;
                return;
            }
            pos += field_bytes;
        }
    }
    if (pos != n) {
        out->code = TRAILING;
        out->value = n - pos;
        return;
    }
    if (largest != max_ts) {
        out->code = MAX_TIMESTAMP;
        out->value = largest;
    }
}

/* The message for `pr`: the same words as records_problem_py. */
static PyObject *describe(const problem *pr, Py_ssize_t n, Py_ssize_t count, long long max_ts) {
    switch (pr->code) {
    case OK:
        Py_RETURN_NONE;
    case NO_RECORDS:
        return PyUnicode_FromFormat("record_count %lld is below 1", pr->value);
    case FIRST_TIMESTAMP:
        return PyUnicode_FromFormat("first_timestamp_ms %lld is outside [0, %lld]", pr->value,
                                    MAX_TIMESTAMP_MS);
    case RECORD_HEADER_PAST:
        return PyUnicode_FromFormat(
            "record %zd: its header runs past the records section end (byte %zd of %zd)",
            pr->record, pr->pos, n);
    case FIRST_DELTA:
        return PyUnicode_FromFormat(
            "record 0: timestamp delta %lld is not 0 (first_timestamp_ms is the first "
            "record's timestamp)",
            pr->value);
    case TIMESTAMP:
        return PyUnicode_FromFormat("record %zd: timestamp %lld is outside [0, %lld]", pr->record,
                                    pr->value, MAX_TIMESTAMP_MS);
    case KEY_LENGTH:
        return PyUnicode_FromFormat("record %zd: key length %lld is below -1", pr->record,
                                    pr->value);
    case KEY_PAST:
        return PyUnicode_FromFormat(
            "record %zd: key of %lld bytes runs past the records section end (byte %zd of %zd)",
            pr->record, pr->value, pr->pos, n);
    case VALUE_LENGTH:
        return PyUnicode_FromFormat("record %zd: value length %lld is below -1", pr->record,
                                    pr->value);
    case VALUE_PAST:
        return PyUnicode_FromFormat(
            "record %zd: value of %lld bytes runs past the records section end (byte %zd of "
            "%zd)",
            pr->record, pr->value, pr->pos, n);
    case HEADER_PAST:
        return PyUnicode_FromFormat(
            "record %zd: header %zd runs past the records section end (byte %zd of %zd)",
            pr->record, pr->header, pr->pos, n);
    case NAME_PAST:
        return PyUnicode_FromFormat(
            "record %zd: header %zd: name of %lld bytes runs past the records section end "
            "(byte %zd of %zd)",
            pr->record, pr->header, pr->value, pr->pos, n);
    case NAME_UTF8:
        return PyUnicode_FromFormat("record %zd: header %zd: name is not valid UTF-8",
                                    pr->record, pr->header);
    case HEADER_VALUE_PAST:
        return PyUnicode_FromFormat(
            "record %zd: header %zd: value of %lld bytes runs past the records section end "
            "(byte %zd of %zd)",
            pr->record, pr->header, pr->value, pr->pos, n);
    case TRAILING:
        return PyUnicode_FromFormat("%lld bytes follow the last of %zd records", pr->value,
                                    count);
    case MAX_TIMESTAMP:
        return PyUnicode_FromFormat(
            "max_timestamp_ms %lld is not the largest record timestamp, %lld", max_ts,
            pr->value);
    }
    PyErr_SetString(PyExc_SystemError, "unknown records problem");
    return NULL;
}

static PyObject *records_problem(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer view;
    Py_ssize_t count;
    long long first, max_ts;
    if (!PyArg_ParseTuple(args, "y*nLL:records_problem", &view, &count, &first, &max_ts)) {
        return NULL;
    }
    problem pr = {OK, 0, 0, 0, 0};
    const unsigned char *p = (const unsigned char *)view.buf;
    Py_ssize_t n = view.len;
    if (n >= NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS walk(p, n, count, first, max_ts, &pr);
        Py_END_ALLOW_THREADS
    } else {
        walk(p, n, count, first, max_ts, &pr);
    }
    PyBuffer_Release(&view);
    return describe(&pr, n, count, max_ts);
}

static PyMethodDef methods[] = {
    {"records_problem", records_problem, METH_VARARGS,
     "records_problem(payload, record_count, first_timestamp_ms, max_timestamp_ms) -> str | "
     "None\n\nNone if the records section `payload` is valid for the header's record count and "
     "timestamps, else the first problem found."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_records",
    .m_doc = "The record batch's records-section walker, in C.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__records(void) {
    return PyModule_Create(&module);
}
