// The ESM entry of tally-agent/adapters/mcp (adapters/mcp.js).
import m from './mcp.js';

export const { recordClient, ToolCheckRefused } = m;
