// The ESM entry of tally-agent/adapters/anthropic (adapters/anthropic.js).
import m from './anthropic.js';

export const { runToolUses } = m;
