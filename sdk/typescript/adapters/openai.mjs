// The ESM entry of tally-agent/adapters/openai (adapters/openai.js).
import m from './openai.js';

export const { runToolCalls } = m;
