export {
  SeedkeeperClient,
  FUNCTIONS,
  FINAL_TIMEOUT_MS,
  MAX_ANSWER_BYTES,
  POLL_INTERVAL_MS,
  REQUEST_TIMEOUT_MS,
  type ClientOptions,
  type Credentials,
  type Fetch,
} from "./client.js";
export { isCold, isNotSeeded, isSeeded, isSeeding, sameClaim } from "./answers.js";
export {
  AnswerTooLarge,
  BadAnswer,
  ClaimNotEchoed,
  SeedkeeperError,
  SeedkeeperRefused,
  SeedTimeout,
  Unreachable,
} from "./errors.js";
export type * from "./types.js";
