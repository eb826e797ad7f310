'use strict';
// The TypeScript declarations compile against a use of every API item and
// adapter (test/types-check.ts) with the pinned `typescript`, strict.
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');

const pkg = path.resolve(__dirname, '..');

test('index.d.ts and the adapters’ declarations type-check', () => {
  const tsc = path.join(pkg, 'node_modules', 'typescript', 'bin', 'tsc');
  const r = spawnSync(
    process.execPath,
    [tsc, '--noEmit', '--strict', '--module', 'nodenext', '--moduleResolution', 'nodenext', '--target', 'es2022', '--skipLibCheck', 'false', path.join(__dirname, 'types-check.ts')],
    { cwd: pkg, encoding: 'utf8' },
  );
  assert.equal(r.status, 0, r.stdout + r.stderr);
});
