// The chart of the last minutes: throughput, lag and LSO gap, fed by /events/series.
(function () {
  const box = document.getElementById("chart");
  if (!box) return;
  const opts = {
    width: Math.min(window.innerWidth - 60, 1100), height: 180,
    series: [
      {},
      { label: "throughput (records/s)", stroke: "#2e6fd8", scale: "rate" },
      { label: "lag (records)", stroke: "#d8872e", scale: "n" },
      { label: "LSO gap (records)", stroke: "#c0392b", scale: "n" },
    ],
    axes: [{}, { scale: "rate", label: "records/s" }, { scale: "n", side: 1, label: "records", grid: { show: false } }],
  };
  const plot = new uPlot(opts, [[], [], [], []], box);
  const source = new EventSource("/events/series");
  source.addEventListener("series", (e) => {
    const s = JSON.parse(e.data);
    plot.setData([s.t, s.throughput, s.lag, s.lso_gap]);
    box.dataset.points = String(s.t.length);
  });
})();

// A `semel check` run's timeline: operations per second by outcome, with the
// faults and anomalies as points on their own row.
(function () {
  const box = document.getElementById("timeline");
  if (!box) return;
  const s = JSON.parse(box.dataset.series);
  const marks = (list) => s.t.map((t) => (list.some(([at]) => Math.floor(at) === t) ? 0 : null));
  const opts = {
    width: Math.min(window.innerWidth - 60, 1100), height: 220,
    scales: { x: { time: false } },
    series: [
      {},
      { label: "ok", stroke: "#2a9d4b" },
      { label: "fail", stroke: "#d8872e" },
      { label: "info (unknown)", stroke: "#7f7f7f" },
      { label: "fault", stroke: "#6a3d9a", width: 0, points: { show: true, size: 9 } },
      { label: "anomaly", stroke: "#c0392b", width: 0, points: { show: true, size: 11 } },
    ],
    axes: [{ label: "seconds into the run" }, { label: "ops/s" }],
  };
  new uPlot(opts, [s.t, s.ok, s.fail, s.info, marks(s.faults), marks(s.anomalies)], box);
})();
