// The ESM entry of tally-agent: the same module as index.js (CommonJS).
import tally from './index.js';

export const {
  Agent,
  CallHandle,
  TallyError,
  AgentNotFound,
  BadContent,
  Invalid,
  NotRecorded,
  NoReceipt,
  Closed,
} = tally;
export default tally;
