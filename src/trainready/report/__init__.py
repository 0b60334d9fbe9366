"""Self-contained HTML reports: `trainready report RUN_DIR --html FILE` (run_page) and
`trainready plan ... --html FILE` (plan_page). Charts are matplotlib SVG inlined in the page
(docs/run.md, "HTML report": why matplotlib), so a page opens offline with no script at all.
This layer reads run/ and plan/ results and never imports cli/."""
