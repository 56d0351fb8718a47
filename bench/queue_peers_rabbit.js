// RabbitMQ quorum-queue work-queue client for bench/queue_peers.py (issue 6), Node + amqplib.
//
// node bench/queue_peers_rabbit.js MODE --url amqp://guest:guest@127.0.0.1:5673/ [options]
//   setup  delete and re-declare the quorum queue (--group-size replicas, durable)
//   pub    publish --count persistent messages of --size bytes with publisher confirms,
//          --window unconfirmed at most (the peers' fastest RabbitMQ publisher: a ConfirmChannel)
//   drain  --consumers connections, one channel each, prefetch --prefetch, consume the queue and
//          ack every message individually (--ack-every 1, multiple=false) or every N with
//          multiple=true; msgs/s = acked / (last ack sent - first consume); then close the
//          channels and check the queue is empty (all acks were processed)
//   lat    the same consumers, plus one confirm publisher at --rate msg/s for --duration s with a
//          timestamp in the body; latency = time the consumer acks - time just before publish
//          (one process, one clock); also publish->confirm
// Every loop is bounded by --count and --max-seconds. Prints "GO" when the measured phase
// starts, "END" when it ends, and one line "RESULT {json}".
"use strict";
const amqp = require("amqplib");
const { performance } = require("perf_hooks");

function parseArgs(argv) {
  const a = {
    mode: argv[0], url: "amqp://guest:guest@127.0.0.1:5672/", queue: "wq", groupSize: 3,
    count: 100000, size: 1120, window: 2000, maxSeconds: 60, consumers: 4, prefetch: 500,
    ackEvery: 1, rate: 2000, duration: 10, warmup: 200, settleMs: 1000,
  };
  const keys = {
    "--url": "url", "--queue": "queue", "--group-size": "groupSize", "--count": "count",
    "--size": "size", "--window": "window", "--max-seconds": "maxSeconds",
    "--consumers": "consumers", "--prefetch": "prefetch", "--ack-every": "ackEvery",
    "--rate": "rate", "--duration": "duration", "--warmup": "warmup",
    "--settle-ms": "settleMs",
  };
  for (let i = 1; i < argv.length; i += 2) {
    const k = keys[argv[i]];
    if (!k) throw new Error(`unknown option ${argv[i]}`);
    a[k] = k === "url" || k === "queue" ? argv[i + 1] : Number(argv[i + 1]);
  }
  return a;
}

function pct(sorted, q) {
  if (!sorted.length) return null;
  const k = Math.min(sorted.length - 1, Math.max(0, Math.round((q / 100) * (sorted.length - 1))));
  return Math.round(sorted[k] * 1000) / 1000;
}

function summary(lats) {
  const v = Float64Array.from(lats).sort();
  if (!v.length) return { n: 0 };
  let s = 0;
  for (const x of v) s += x;
  return {
    n: v.length, p50_ms: pct(v, 50), p90_ms: pct(v, 90), p99_ms: pct(v, 99),
    p999_ms: pct(v, 99.9), max_ms: pct(v, 100), mean_ms: Math.round((s / v.length) * 1000) / 1000,
  };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function queueArgs(a) {
  const args = { "x-queue-type": "quorum" };
  if (a.groupSize > 0) args["x-quorum-initial-group-size"] = a.groupSize;
  return { durable: true, arguments: args };
}

async function setup(a) {
  const conn = await amqp.connect(a.url);
  const ch = await conn.createChannel();
  await ch.deleteQueue(a.queue);
  const ok = await ch.assertQueue(a.queue, queueArgs(a));
  await conn.close();
  return { declared: a.queue, messages: ok.messageCount, group_size: a.groupSize };
}

// A confirm publisher with at most `window` unconfirmed messages.
async function confirmPublisher(a) {
  const conn = await amqp.connect(a.url);
  const ch = await conn.createConfirmChannel();
  const st = { outstanding: 0, acked: 0, nacked: 0, waiter: null, conn, ch };
  st.publish = (body, onConfirm) => {
    st.outstanding++;
    const ok = ch.sendToQueue(a.queue, body, { persistent: true }, (err) => {
      st.outstanding--;
      if (err) st.nacked++;
      else st.acked++;
      if (onConfirm) onConfirm(err);
      if (st.waiter && st.outstanding < a.window) {
        const w = st.waiter;
        st.waiter = null;
        w();
      }
    });
    return ok;
  };
  st.room = () =>
    st.outstanding < a.window ? null : new Promise((r) => { st.waiter = r; });
  st.drained = () => new Promise((r) => ch.once("drain", r));
  return st;
}

async function pub(a) {
  const p = await confirmPublisher(a);
  const body = Buffer.alloc(a.size, 0x61);
  console.log("GO");
  const t0 = performance.now();
  const deadline = t0 + a.maxSeconds * 1000;
  let sent = 0;
  while (sent < a.count) {
    if ((sent & 1023) === 0 && performance.now() > deadline) break;
    const room = p.room();
    if (room) await room;
    if (!p.publish(body)) await p.drained();
    sent++;
  }
  const hard = performance.now() + 60000;
  while (p.outstanding > 0 && performance.now() < hard) await sleep(1);
  const el = (performance.now() - t0) / 1000;
  console.log("END");
  await p.conn.close();
  return {
    sent, confirmed: p.acked, nacked: p.nacked, window: a.window, elapsed_s: el,
    msgs_per_s: p.acked / el, MB_per_s: (p.acked * a.size) / el / 1e6,
  };
}

// --consumers connections (one channel each) sharing the queue; calls onMsg(body, now) per
// message before acking it. Returns handles; stop with close().
async function startConsumers(a, onMsg) {
  const cs = [];
  for (let i = 0; i < a.consumers; i++) {
    const conn = await amqp.connect(a.url);
    const ch = await conn.createChannel();
    await ch.prefetch(a.prefetch);
    cs.push({ conn, ch, n: 0, redelivered: 0, tag: null });
  }
  for (const c of cs) {
    const ok = await c.ch.consume(a.queue, (m) => {
      if (m === null) return;
      c.n++;
      if (m.fields.redelivered) c.redelivered++;
      onMsg(m.content);
      if (a.ackEvery <= 1) c.ch.ack(m, false);
      else if (c.n % a.ackEvery === 0) c.ch.ack(m, true);
      else c.last = m;
    }, { noAck: false });
    c.tag = ok.consumerTag;
  }
  return cs;
}

async function closeConsumers(a, cs) {
  for (const c of cs) {
    if (a.ackEvery > 1 && c.last && c.n % a.ackEvery !== 0) c.ch.ack(c.last, true);
  }
  // closing a channel returns after the broker processed the acks sent on it before
  await Promise.all(cs.map(async (c) => {
    try { await c.ch.close(); } catch (e) { /* closed */ }
    try { await c.conn.close(); } catch (e) { /* closed */ }
  }));
}

async function queueDepth(a) {
  const conn = await amqp.connect(a.url);
  const ch = await conn.createChannel();
  const ok = await ch.checkQueue(a.queue);
  await conn.close();
  return ok.messageCount;
}

async function drain(a) {
  const before = await queueDepth(a);
  const total = Math.min(a.count, before);
  let got = 0, bytes = 0, tLast = 0, resolveDone;
  const done = new Promise((r) => { resolveDone = r; });
  const t0 = performance.now();
  console.log("GO");
  const cs = await startConsumers(a, (body) => {
    got++;
    bytes += body.length;
    if (got >= total) { tLast = performance.now(); resolveDone(); }
  });
  const timer = setTimeout(resolveDone, a.maxSeconds * 1000);
  await done;
  clearTimeout(timer);
  if (!tLast) tLast = performance.now();
  const el = (tLast - t0) / 1000;
  console.log("END");
  // acks are one-way in AMQP: give the broker --settle-ms to apply them before closing
  // (closing a channel returns its still-unsettled messages to the queue)
  if (a.settleMs > 0) await sleep(a.settleMs);
  await closeConsumers(a, cs);
  const tc = performance.now();
  const elClosed = (tc - t0) / 1000 - a.settleMs / 1000;
  let after = await queueDepth(a);
  while (after > 0 && performance.now() - tc < 10000) { await sleep(100); after = await queueDepth(a); }
  return {
    queue_msgs: before, target: total, acked: got, elapsed_s: el, msgs_per_s: got / el,
    elapsed_incl_close_s: elClosed, msgs_per_s_incl_close: got / elClosed,
    MB_per_s: bytes / el / 1e6, consumers: a.consumers, prefetch: a.prefetch,
    ack: a.ackEvery <= 1 ? "per message (multiple=false)" : `multiple every ${a.ackEvery}`,
    per_consumer: cs.map((c) => c.n), redelivered: cs.reduce((s, c) => s + c.redelivered, 0),
    ready_after_close: after,
  };
}

async function lat(a) {
  const e2e = [], conf = [];
  let got = 0, stale = 0;
  const cs = await startConsumers(a, (body) => {
    const now = performance.now();
    got++;
    const ts = body.readDoubleLE(0);
    const seq = body.readUInt32LE(8);
    if (seq >= a.warmup) e2e.push(now - ts);
    else stale++;
  });
  const p = await confirmPublisher({ ...a, window: 1e9 });
  const body0 = Buffer.alloc(a.size, 0x61);
  const send = (seq, warm) => {
    const b = Buffer.from(body0);
    const ts = performance.now();
    b.writeDoubleLE(ts, 0);
    b.writeUInt32LE(seq, 8);
    p.publish(b, (err) => { if (!err && !warm) conf.push(performance.now() - ts); });
  };
  for (let i = 0; i < a.warmup; i++) { send(i, true); await sleep(1); }
  const tw = performance.now();
  while (got < a.warmup && performance.now() - tw < 10000) await sleep(10);
  const n = Math.min(a.count, Math.floor(a.rate * a.duration));
  console.log("GO");
  const t0 = performance.now();
  const hard = t0 + (a.duration + a.maxSeconds) * 1000;
  let sent = 0;
  while (sent < n && performance.now() < hard) {
    const due = Math.min(n, Math.floor(((performance.now() - t0) / 1000) * a.rate) + 1);
    while (sent < due) { send(a.warmup + sent, false); sent++; }
    const d = t0 + (sent / a.rate) * 1000 - performance.now();
    await sleep(d > 1 ? d : 0);
  }
  const tSent = performance.now();
  while (e2e.length < sent && performance.now() - tSent < 30000) await sleep(2);
  const el = (performance.now() - t0) / 1000;
  console.log("END");
  await closeConsumers(a, cs);
  await p.conn.close();
  return {
    target_rate: a.rate, duration_s: a.duration, sent, received: e2e.length, elapsed_s: el,
    achieved_rate: e2e.length / el, latency_publish_to_ack: summary(e2e),
    latency_publish_to_confirm: summary(conf), consumers: a.consumers, prefetch: a.prefetch,
    ack: a.ackEvery <= 1 ? "per message (multiple=false)" : `multiple every ${a.ackEvery}`,
    warmup_msgs: a.warmup,
  };
}

async function main() {
  const a = parseArgs(process.argv.slice(2));
  const modes = { setup, pub, drain, lat };
  if (!modes[a.mode]) throw new Error(`mode must be one of ${Object.keys(modes)}`);
  const guard = setTimeout(() => {
    console.error("hard time limit reached");
    process.exit(3);
  }, (a.maxSeconds * 3 + a.duration + 120) * 1000);
  guard.unref();
  const res = await modes[a.mode](a);
  res.mode = a.mode;
  res.size = a.size;
  res.client = `node ${process.version} amqplib ${require("amqplib/package.json").version}`;
  console.log("RESULT " + JSON.stringify(res));
  process.exit(0);
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
