/**
 * What the client throws. No message names the URL called, a header or a signature: an
 * error may be logged anywhere.
 */

/** The base of every error the client throws. */
export class SeedkeeperError extends Error {
  override name = "SeedkeeperError";
}

/** Any answer but a 2xx: a 4xx or 5xx, or a redirect (never followed: reason "redirected",
 * body `{}`). `reason` is its reason token: the first of the JSON body's `error` and
 * `message` that is a string with something left without control characters, cut to 64
 * characters; else "unknown" (for a body that is not JSON too: a proxy's page may name a
 * host). `body` is the answer's JSON object, or `{error: text}` (its first 200 characters)
 * for one that is not JSON or not an object. */
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

/** No answer: refused, reset or timed out (or `AnswerTooLarge`). The message names the
 * cause's code only. */
export class Unreachable extends SeedkeeperError {
  override name = "Unreachable";
}

/** More than a function URL can answer (`MAX_ANSWER_BYTES`, Lambda's 6 MB), 2xx or not:
 * no answer of Seedkeeper's, so an `Unreachable` (treat it as an answer not received). The
 * client stops reading it there: it is never read whole. */
export class AnswerTooLarge extends Unreachable {
  override name = "AnswerTooLarge";
}

/** `seed(..., {wait: true})` polled past its timeout and the slot is still seeding. */
export class SeedTimeout extends SeedkeeperError {
  override name = "SeedTimeout";
}
