// tally console: the little script the pages use (served at
// /console/assets/console.js; the Content-Security-Policy allows no other).
// Everything works without it; it adds a copy button for auditor links, a
// confirmation before revoking, and auto-submits the status filter.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  for (const b of document.querySelectorAll("button.copy[data-copy]")) {
    b.addEventListener("click", () => {
      const url = new URL(b.dataset.copy, window.location.href).href;
      if (navigator.clipboard) {
        navigator.clipboard.writeText(url).then(() => { b.textContent = "Copied"; }, () => {});
      }
    });
  }
  for (const f of document.querySelectorAll("form.revoke")) {
    f.addEventListener("submit", (e) => {
      if (!window.confirm("Revoke this auditor link? It stops working at once.")) e.preventDefault();
    });
  }
  const status = document.querySelector("form.filters select[name=status]");
  if (status) status.addEventListener("change", () => status.form.submit());
});
