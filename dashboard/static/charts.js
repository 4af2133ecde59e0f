// Live charts: polls /api/history and redraws (Chart.js from Debian's libjs-chart.js).
"use strict";
(function () {
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  let tpsChart = null;
  let lagChart = null;

  function label(ts) {
    return new Date(ts).toISOString().substring(11, 19);
  }

  function makeChart(id) {
    const el = document.getElementById(id);
    if (!el || typeof window.Chart === "undefined") return null;
    return new window.Chart(el, {
      type: "line",
      data: { labels: [], datasets: [] },
      options: { animation: false, responsive: false, scales: { y: { beginAtZero: true } } },
    });
  }

  function setDatasets(chart, labels, series) {
    if (!chart) return;
    chart.data.labels = labels;
    chart.data.datasets = series.map(function (s, i) {
      return { label: s.name, data: s.values, borderColor: COLORS[i % COLORS.length],
        backgroundColor: COLORS[i % COLORS.length], pointRadius: 2, tension: 0.2 };
    });
    chart.update();
  }

  function cell(row, text) {
    const td = document.createElement("td");
    td.textContent = text; // never innerHTML: group names come from strangers
    row.appendChild(td);
  }

  function showLatest(sample) {
    const body = document.querySelector("#latest tbody");
    if (!body || !sample) return;
    body.replaceChildren();
    const rows = [["time (UTC)", label(sample.ts)], ["TPS in", String(sample.tpsIn)],
      ["TPS out", String(sample.tpsOut)]];
    Object.keys(sample.lag).forEach(function (g) { rows.push(["lag " + g, String(sample.lag[g])]); });
    rows.forEach(function (r) {
      const tr = document.createElement("tr");
      tr.className = "sample-row";
      cell(tr, r[0]);
      cell(tr, r[1]);
      body.appendChild(tr);
    });
  }

  async function refresh() {
    let data;
    try {
      const resp = await fetch("/api/history", { credentials: "same-origin" });
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      data = await resp.json();
    } catch (e) {
      const err = document.getElementById("sample-error");
      err.textContent = "cannot load the history: " + e.message;
      err.classList.remove("hidden");
      return;
    }
    const err = document.getElementById("sample-error");
    if (data.error) {
      err.textContent = "last sample failed: " + data.error;
      err.classList.remove("hidden");
    } else {
      err.classList.add("hidden");
    }
    const samples = data.samples || [];
    const labels = samples.map(function (s) { return label(s.ts); });
    setDatasets(tpsChart, labels, [
      { name: "TPS in", values: samples.map(function (s) { return s.tpsIn; }) },
      { name: "TPS out", values: samples.map(function (s) { return s.tpsOut; }) },
    ]);
    const groups = new Set();
    samples.forEach(function (s) { Object.keys(s.lag).forEach(function (g) { groups.add(g); }); });
    setDatasets(lagChart, labels, Array.from(groups).sort().map(function (g) {
      return { name: g, values: samples.map(function (s) { return g in s.lag ? s.lag[g] : null; }) };
    }));
    showLatest(samples[samples.length - 1]);
  }

  document.addEventListener("DOMContentLoaded", function () {
    tpsChart = makeChart("tps-chart");
    lagChart = makeChart("lag-chart");
    refresh();
    window.setInterval(refresh, 3000);
  });
})();
