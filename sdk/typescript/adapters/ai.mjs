// The ESM entry of tally-agent/adapters/ai (adapters/ai.js).
import m from './ai.js';

export const { recordTools, checkSteps } = m;
