// Checks the shipped dashboard two ways:
//   1. against Grafana's own dashboard types (@grafana/schema): the JSON, less the import
//      wrapper (__inputs, __requires, which Grafana strips when it imports), is written out
//      as a TypeScript literal typed as Dashboard, and tsc checks it; a JSON import would
//      widen every string and check nothing;
//   2. Arbiter's rules: every panel has a unit and a description, and filters by $service
//      unless its description says why it cannot (router- or control-plane-wide metrics).
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const dashboard = JSON.parse(readFileSync(join(here, "..", "arbiter.json"), "utf8"));

const problems = [];
if (!dashboard.__inputs?.some((i) => i.type === "datasource" && i.pluginId === "prometheus")) {
  problems.push("no __inputs datasource input: the JSON cannot be imported into another Grafana as is");
}
for (const p of dashboard.panels) {
  if (p.type === "row") continue;
  if (!p.fieldConfig?.defaults?.unit) problems.push(`panel "${p.title}": no unit`);
  if (!p.description) problems.push(`panel "${p.title}": no description`);
  const wide = /(Router|Control-plane)-wide/.test(p.description ?? "");
  for (const t of p.targets ?? []) {
    if (!t.expr.includes("$service") && !wide) {
      problems.push(`panel "${p.title}": ${t.expr} ignores $service (and the description does not say why)`);
    }
  }
}

const { __inputs, __requires, ...body } = dashboard;
const out = join(here, "build");
mkdirSync(out, { recursive: true });
writeFileSync(join(out, "dashboard.ts"),
  `import type { Dashboard } from "@grafana/schema";\nexport const dashboard: Dashboard = ${JSON.stringify(body, null, 2)};\n`);
writeFileSync(join(out, "tsconfig.json"), JSON.stringify({
  compilerOptions: { strict: true, noEmit: true, module: "nodenext", moduleResolution: "nodenext", skipLibCheck: true, target: "es2022",
    typeRoots: [join(here, "node_modules", "@types")] },
  files: ["dashboard.ts"],
}));
try {
  execFileSync(join(here, "node_modules", ".bin", "tsc"), ["-p", out], { stdio: "pipe", cwd: here });
} catch (e) {
  problems.push(`against @grafana/schema's Dashboard type:\n${e.stdout}${e.stderr}`);
}

if (problems.length > 0) {
  console.error(`monitoring/grafana/arbiter.json: ${problems.length} problems:\n- ${problems.join("\n- ")}`);
  process.exit(1);
}
console.log(`monitoring/grafana/arbiter.json: ${dashboard.panels.length} panels valid against @grafana/schema, each with a unit, a description and the $service filter`);
