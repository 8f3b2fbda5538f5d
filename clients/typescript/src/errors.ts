/**
 * What the client throws. No message names the URL called, a header or a signature: an
 * error may be logged anywhere.
 */

/** The base of every error the client throws. */
export class SeedkeeperError extends Error {
  override name = "SeedkeeperError";
}

/** A 4xx or 5xx answer; `reason` is its reason token (`body.error`, else `body.message`,
 * else "unknown"), `body` the answer's JSON (or `{error: text}` for one that is not JSON). */
export class SeedkeeperRefused extends SeedkeeperError {
  override name = "SeedkeeperRefused";

  constructor(
    readonly status: number,
    readonly reason: string,
    readonly body: unknown,
  ) {
    super(`${status} ${reason}`);
  }
}

/** A slot answer that does not prove it is about this claim (or this slot). */
export class ClaimNotEchoed extends SeedkeeperError {
  override name = "ClaimNotEchoed";
}

/** A 2xx answer that is not JSON, or not the shape its route answers with. */
export class BadAnswer extends SeedkeeperError {
  override name = "BadAnswer";
}

/** No answer: refused, reset or timed out. The message names the cause's code only. */
export class Unreachable extends SeedkeeperError {
  override name = "Unreachable";
}

/** `seed(..., {wait: true})` polled past its timeout and the slot is still seeding. */
export class SeedTimeout extends SeedkeeperError {
  override name = "SeedTimeout";
}
