"use strict";
// The Laminar console's script. Regions marked data-refresh are rendered again by the server
// every few seconds and swapped in (never the one holding the keyboard focus); the charts
// page polls the console's rates and draws the last points as SVG lines.
(function () {
  const REFRESH_MS = 4000;
  const SVG = "http://www.w3.org/2000/svg";

  function stamp(text) {
    const element = document.querySelector("[data-refreshed]");
    if (element) element.textContent = text;
  }

  async function refresh() {
    const regions = document.querySelectorAll("[data-refresh]");
    if (!regions.length) return;
    let response;
    try {
      response = await fetch(window.location.href, {
        headers: { Accept: "text/html" },
        cache: "no-store",
      });
    } catch (error) {
      stamp("Refresh failed: the broker did not answer.");
      return;
    }
    if (new URL(response.url).pathname === "/console/login") {
      window.location.assign("/console/login"); // the session ended
      return;
    }
    if (!response.ok) {
      stamp("Refresh failed: status " + response.status + ".");
      return;
    }
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    for (const region of regions) {
      if (region.contains(document.activeElement)) continue;
      const replacement = fresh.getElementById(region.id);
      if (replacement) region.replaceWith(document.importNode(replacement, true));
    }
    const shown = fresh.querySelector("[data-refreshed]");
    if (shown) stamp(shown.textContent);
  }

  function element(name, attributes) {
    const node = document.createElementNS(SVG, name);
    for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, String(value));
    return node;
  }

  function format(value, digits) {
    return value === null || value === undefined ? "n/a" : Number(value).toFixed(digits);
  }

  // Lines of `series` ([{values, cls}], values null where unknown) in `svg`, scaled to the
  // largest value, with the axis labelled in `unit`.
  function draw(svg, series, unit) {
    const width = 600, height = 200, left = 56, right = 8, top = 10, bottom = 24;
    let largest = 0;
    for (const s of series) for (const v of s.values) if (v !== null) largest = Math.max(largest, v);
    largest = largest > 0 ? largest * 1.1 : 1;
    const count = Math.max(2, ...series.map((s) => s.values.length));
    const x = (i) => left + (i * (width - left - right)) / (count - 1);
    const y = (v) => top + (height - top - bottom) * (1 - v / largest);
    svg.replaceChildren();
    svg.append(element("line", { class: "axis", x1: left, y1: top, x2: left, y2: height - bottom }));
    svg.append(element("line", {
      class: "axis", x1: left, y1: height - bottom, x2: width - right, y2: height - bottom,
    }));
    for (const [value, at] of [[largest, top + 10], [0, height - bottom]]) {
      const label = element("text", { x: 4, y: at });
      label.textContent = format(value, value >= 100 ? 0 : 1);
      svg.append(label);
    }
    const caption = element("text", { x: left + 4, y: height - 6 });
    caption.textContent = unit + ", oldest to newest";
    svg.append(caption);
    for (const s of series) {
      let points = [];
      const flush = () => {
        if (points.length > 1) {
          svg.append(element("polyline", { class: "line " + s.cls, points: points.join(" ") }));
        }
        points = [];
      };
      s.values.forEach((v, i) => {
        if (v === null) flush();
        else points.push(x(i).toFixed(1) + "," + y(v).toFixed(1));
      });
      flush();
    }
  }

  function charts(root) {
    const url = root.dataset.charts;
    const pollMs = Number(root.dataset.pollMs) || 2000;
    const keep = Number(root.dataset.points) || 60;
    const samples = [];
    async function poll() {
      let sample;
      try {
        const response = await fetch(url, { cache: "no-store" });
        if (new URL(response.url).pathname === "/console/login" || response.status === 401) {
          window.location.assign("/console/login");
          return;
        }
        if (!response.ok) return;
        sample = await response.json();
      } catch (error) {
        return;
      }
      if (sample.interval_s === null) return;
      samples.push(sample);
      while (samples.length > keep) samples.shift();
      const pick = (name) => samples.map((s) => (s[name] === undefined ? null : s[name]));
      draw(document.getElementById("chart-rates"), [
        { values: pick("publish_per_s"), cls: "line-a" },
        { values: pick("consume_per_s"), cls: "line-b" },
      ], "records/s");
      draw(document.getElementById("chart-latency"), [
        { values: pick("append_p99_ms"), cls: "line-a" },
        { values: pick("append_p50_ms"), cls: "line-b" },
        { values: pick("read_p99_ms"), cls: "line-c" },
      ], "ms");
      document.getElementById("rates-latest").textContent =
        "Latest: published " + format(sample.publish_per_s, 1) + " records/s, consumed " +
        format(sample.consume_per_s, 1) + " records/s, over " + sample.brokers + " brokers.";
      document.getElementById("latency-latest").textContent =
        "Latest: append p50 " + format(sample.append_p50_ms, 2) + " ms, p99 " +
        format(sample.append_p99_ms, 2) + " ms; read p50 " + format(sample.read_p50_ms, 2) +
        " ms, p99 " + format(sample.read_p99_ms, 2) + " ms.";
      root.dataset.samples = String(samples.length);
    }
    poll();
    window.setInterval(poll, pollMs);
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (document.querySelector("[data-refresh]")) window.setInterval(refresh, REFRESH_MS);
    const root = document.querySelector("[data-charts]");
    if (root) charts(root);
  });
})();
