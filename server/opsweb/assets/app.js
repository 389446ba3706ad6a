// The status page: polls api/status and redraws. Plain JS, no libraries:
// the page must work where nothing outside the cluster can be reached.
"use strict";

const refreshMs = 2000;

function bytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + units[i];
}

function secs(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1e-3) return (s * 1e6).toFixed(0) + " µs";
  if (s < 1) return (s * 1e3).toFixed(1) + " ms";
  return s.toFixed(2) + " s";
}

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// cell makes a table cell; key and raw value go into data-k and data-v so
// that tools (and the page's test) read numbers, not formatted text.
function cell(key, raw, text, cls) {
  const a = { "data-k": key, "data-v": String(raw) };
  if (cls) a["class"] = cls;
  return el("td", a, text === undefined ? String(raw) : text);
}

function card(key, label, raw, text, fraction) {
  const c = el("div", { class: "card" });
  c.append(el("div", { class: "label" }, label));
  c.append(el("div", { class: "value", "data-k": key, "data-v": String(raw) }, text));
  if (fraction !== undefined) {
    const bar = el("div", { class: "bar" });
    bar.append(el("div", { style: "width:" + Math.min(100, fraction * 100).toFixed(1) + "%" }));
    c.append(bar);
  }
  return c;
}

function fill(id, rows) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren(...rows);
}

let refreshes = 0;

function render(d) {
  const c = d.cluster;
  refreshes++;
  document.getElementById("served-by").textContent = d.served_by;
  const upd = document.getElementById("updated");
  upd.textContent = "updated " + new Date(d.time).toLocaleTimeString();
  upd.className = "";

  const used = c.memory_limit > 0 ? c.physical_bytes / c.memory_limit : undefined;
  document.getElementById("cards").replaceChildren(
    card("leader", "leader", c.leader, c.leader || "none"),
    card("inodes", "inodes", c.inodes, String(c.inodes)),
    card("logical_bytes", "logical bytes", c.logical_bytes, bytes(c.logical_bytes)),
    card("physical_bytes", "physical bytes (memory used)", c.physical_bytes, bytes(c.physical_bytes), used),
    card("memory_limit", "memory limit", c.memory_limit, c.memory_limit ? bytes(c.memory_limit) : "none"),
    card("shared_bytes", "shared bytes", c.shared_bytes, bytes(c.shared_bytes)),
    card("dedup_ratio", "dedup ratio", c.dedup_ratio, c.dedup_ratio.toFixed(2) + "×"),
    card("sessions", "sessions", c.sessions, String(c.sessions)),
    card("capabilities", "capabilities held", d.capabilities, String(d.capabilities)),
    card("heap_bytes", "heap of " + d.served_by, d.heap_bytes, bytes(d.heap_bytes)),
  );

  const opsRate = id => (d.node_ops_per_second || {})[id] || 0;
  document.getElementById("window-commands").textContent = d.window_seconds.toFixed(0);
  const leaderApplied = (c.nodes.find(n => n.id === c.leader) || {}).applied_index;
  fill("members", c.nodes.map(n => {
    const tr = el("tr", { "data-node": n.id });
    const lag = leaderApplied === undefined || n.error ? "" : Math.max(0, leaderApplied - n.applied_index);
    let sync = "";
    if (n.restoring || n.sync_blocks_wanted > n.sync_blocks_fetched) {
      sync = n.sync_blocks_fetched + "/" + n.sync_blocks_wanted + " blocks, " +
        bytes(n.sync_bytes_fetched) + "/" + bytes(n.sync_bytes_wanted) + (n.restoring ? " (restoring)" : "");
    } else if (n.catching_up) {
      // Back empty after losing its state: it votes only once caught up.
      sync = "catching up after losing its state, not voting" + (lag ? ": " + lag + " entries behind" : "");
    } else if (!n.voter && !n.error && lag !== "" && lag > 0) {
      // A node being added (memfs node replace) before its promotion.
      sync = "catching up: " + lag + " entries behind";
    }
    tr.append(
      cell("id", n.id),
      cell("state", n.state, n.state || "?", n.state),
      cell("term", n.term, n.error ? "–" : String(n.term), "num"),
      cell("voter", n.voter, n.voter ? "yes" : "no"),
      cell("api_addr", n.api_addr),
      cell("raft_addr", n.raft_addr),
      cell("applied_index", n.applied_index, undefined, "num"),
      cell("commit_index", n.commit_index, undefined, "num"),
      cell("lag", lag, undefined, "num"),
      cell("ops_per_second", opsRate(n.id), n.error ? "–" : opsRate(n.id).toFixed(1), "num"),
      cell("physical_bytes", n.physical_bytes, n.error ? "–" : bytes(n.physical_bytes), "num"),
      cell("sync", sync),
      cell("error", n.error || "", n.error || "", "err"),
    );
    return tr;
  }));

  const ops = list => list.map(o => {
    const tr = el("tr", { "data-op": o.name });
    tr.append(cell("name", o.name), cell("per_second", o.per_second, o.per_second.toFixed(1), "num"),
      cell("p99_seconds", o.p99_seconds ?? "", secs(o.p99_seconds), "num"));
    return tr;
  });
  fill("commands", ops(d.commands));
  fill("reads", ops(d.reads));

  const changes = d.leader_changes;
  const lc = document.getElementById("leader-changes");
  lc.textContent = String(Math.max(0, changes.length - 1));
  lc.setAttribute("data-v", String(Math.max(0, changes.length - 1)));
  fill("leaders", changes.slice().reverse().map(ch => {
    const tr = el("tr");
    tr.append(cell("time", ch.time, new Date(ch.time).toLocaleTimeString()),
      cell("term", ch.term), cell("leader", ch.leader, ch.leader || "(none)"));
    return tr;
  }));
  // For tools and the page's tests: how many answers were drawn, and
  // the served time and status age of the last one.
  document.body.setAttribute("data-loaded", "true");
  document.body.setAttribute("data-refreshes", String(refreshes));
  document.body.setAttribute("data-time", d.time);
  document.body.setAttribute("data-status-age", String(d.status_age_seconds));
}

async function refresh() {
  try {
    const r = await fetch("api/status", { cache: "no-store" });
    if (!r.ok) throw new Error(r.status + " " + r.statusText);
    render(await r.json());
  } catch (e) {
    const upd = document.getElementById("updated");
    upd.textContent = "cannot reach the node (" + e.message + "); retrying";
    upd.className = "stale";
  }
  setTimeout(refresh, refreshMs);
}

refresh();
