'use strict';
// Builds the native addon (the Rust crate in this folder, a member of the
// tally workspace two folders up) with cargo and copies it beside the JS
// loader as tally.node: the package's `install` script (README.md
// "Install"). Needs Rust (cargo) and Node 20+.
//
// TALLY_NODE_PROFILE=debug builds the dev profile instead of release (the
// tests do, to share the workspace's debug build).
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const here = __dirname;
const workspace = path.resolve(here, '..', '..');
const profile = process.env.TALLY_NODE_PROFILE === 'debug' ? 'debug' : 'release';
const cargo = process.env.CARGO || 'cargo';
const args = ['build', '--locked', '-p', 'tally-node'];
if (profile === 'release') args.push('--release');

const built = spawnSync(cargo, args, { cwd: workspace, stdio: 'inherit' });
if (built.error) {
  console.error(`tally-agent: cannot run ${cargo} (${built.error.message}); the addon is built from source and needs Rust: https://rustup.rs`);
  process.exit(1);
}
if (built.status !== 0) {
  console.error(`tally-agent: \`${cargo} ${args.join(' ')}\` failed in ${workspace}`);
  process.exit(built.status || 1);
}

const target = process.env.CARGO_TARGET_DIR
  ? path.resolve(workspace, process.env.CARGO_TARGET_DIR)
  : path.join(workspace, 'target');
const file = {
  darwin: 'libtally_node.dylib',
  win32: 'tally_node.dll',
}[process.platform] || 'libtally_node.so';
const from = path.join(target, profile, file);
const to = path.join(here, 'tally.node');
// Copy to a temporary name and rename, so a running process that has the
// old file mapped keeps a whole file.
fs.copyFileSync(from, `${to}.tmp`);
fs.renameSync(`${to}.tmp`, to);
console.error(`tally-agent: built ${path.relative(workspace, from)} (${profile}) -> tally.node`);
