// Live updates of the status page: polls /ui/state.json once a second and rewrites the
// sections shown. Every value is set through textContent: values that came from a push
// (ids, hosts, URLs, authorities) are attacker-controlled and must never become markup.
"use strict";

(function () {
  const body = document.body;
  if (!body || body.dataset.live !== "True") {
    return;
  }

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) {
      node.className = className;
    }
    if (text !== undefined && text !== null) {
      node.textContent = String(text);
    }
    return node;
  }

  // Replace the children of `id` with one made per item (left as it is when there are none).
  function refill(id, items, make) {
    const parent = document.getElementById(id);
    if (parent && items.length) {
      parent.replaceChildren(...items.map(make));
    }
  }

  function flag(value) {
    return value === null || value === undefined ? "unknown" : value ? "yes" : "no";
  }

  function rowStatus(r) {
    if (r.errors.length) {
      return "refused: " + r.errors.join("; ");
    }
    if (r.pending) {
      return "pending";
    }
    if (r.served === null) {
      return "committed";
    }
    return r.served ? "served" : "not served";
  }

  function overview(o) {
    for (const node of document.querySelectorAll("#overview [data-field]")) {
      const value = o[node.dataset.field];
      node.textContent = typeof value === "boolean" || value === null ? flag(value) : String(value);
    }
    const leader = document.querySelector('#overview [data-field="leader"]');
    if (leader && !o.leader) {
      leader.textContent = "none";
    }
    const reasons = document.getElementById("reasons");
    if (reasons) {
      reasons.replaceChildren(...o.reasons.map((r) => el("li", "", r)));
    }
  }

  function roots(list) {
    refill("roots", list, (r) => {
      const tr = el("tr", "state-" + r.state);
      const apply = r.apply_seconds ? r.apply_seconds.last + " / " + r.apply_seconds.median : "-";
      for (const [cls, text] of [["", r.root], ["state", r.state], ["", r.committed_revision], ["", r.applied_revision],
        ["", r.lag_seconds], ["", apply], ["", r.paced ? r.paced.ingresses : 0]]) {
        tr.appendChild(el("td", cls, text));
      }
      const blocking = el("td", "blocking");
      for (const advice of r.advice) {
        blocking.appendChild(el("div", "", advice));
      }
      tr.appendChild(blocking);
      return tr;
    });
  }

  function rows(page) {
    const tbody = document.getElementById("rows");
    if (!tbody) {
      return;
    }
    tbody.replaceChildren(...page.rows.map((r) => {
      const tr = el("tr", r.healthy ? "ok" : "bad");
      tr.dataset.key = r.authority + "/" + r.id;
      tr.appendChild(el("td", "", r.authority));
      const idCell = el("td");
      const link = el("a", "", r.id);
      link.href = "/ui/ingress/" + encodeURIComponent(r.authority) + "/" + encodeURIComponent(r.id);
      idCell.appendChild(link);
      tr.appendChild(idCell);
      tr.appendChild(el("td", "", r.revision));
      tr.appendChild(el("td", "", r.hosts.join(", ")));
      tr.appendChild(el("td", "status", rowStatus(r)));
      tr.appendChild(el("td", "", r.canary_weight === null ? "-" : r.canary_weight + "%"));
      const servers = el("td", "servers");
      for (const s of r.servers) {
        const div = el("div", "server " + (s.routed ? "routed" : "ejected"), s.url + " ");
        let verdict = s.status + (s.routed ? "" : ", out of rotation");
        if (s.last_check) {
          verdict += " (last check " + s.last_check + " " + s.last_outcome + ")";
        }
        if (s.ejected_until) {
          verdict += ", ejected until " + s.ejected_until;
        }
        if (s.prober) {
          verdict += ", probed by " + s.prober;
        }
        div.appendChild(el("span", "verdict", verdict));
        servers.appendChild(div);
      }
      tr.appendChild(servers);
      return tr;
    }));
    for (const field of ["matching", "total"]) {
      const node = document.querySelector('#ingresses [data-field="' + field + '"]');
      if (node) {
        node.textContent = String(page[field]);
      }
    }
  }

  function events(list) {
    refill("event-list", list, (e) => {
      const li = el("li", "kind-" + e.kind);
      li.appendChild(el("time", "", e.at));
      li.appendChild(document.createTextNode(" "));
      li.appendChild(el("span", "kind", e.kind));
      li.appendChild(document.createTextNode(" "));
      if (e.id) {
        li.appendChild(el("span", "ref", e.authority + "/" + e.id));
        li.appendChild(document.createTextNode(" "));
      }
      li.appendChild(el("span", "text", e.text));
      return li;
    });
  }

  // At most once a second, and never more than a fifth of the time: at 10,000 ingresses one
  // state costs the daemon a quarter of a second.
  let wait = 1000;

  async function refresh() {
    const started = Date.now();
    try {
      const response = await fetch("/ui/state.json" + window.location.search, { credentials: "same-origin" });
      if (response.ok) {
        const state = await response.json();
        overview(state.overview);
        roots(state.roots);
        rows(state.page);
        events(state.events);
        body.dataset.updated = String(Date.now());
      }
    } finally {
      wait = Math.max(1000, 4 * (Date.now() - started));
      window.setTimeout(refresh, wait);
    }
  }

  window.setTimeout(refresh, 1000);
})();
