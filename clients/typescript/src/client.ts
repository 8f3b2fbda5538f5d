/**
 * The executor's side: `SeedkeeperClient` signs every request with SigV4 (service
 * `lambda`), as function URLs with `AWS_IAM` auth require, and checks what comes back.
 *
 * A claimed seed answer (a resumed one too) must echo the claim and carry an incarnation; a
 * keepalive answer must be about the slot kept alive; anything else throws. It never falls
 * back to treating a claimed slot as cold. A redirect is never followed (it is a refusal),
 * and an answer is read as a stream, no further than a function URL can answer. It uses
 * `fetch`, Web streams and Web Crypto only, so it runs in a Cloudflare Worker and in
 * Node >= 20 alike.
 */

import { AwsClient } from "aws4fetch";

import * as answers from "./answers.js";
import { isSeeding } from "./answers.js";
import type { Check } from "./shape.js";
import { isPlainObject } from "./shape.js";
import {
  AnswerTooLarge,
  BadAnswer,
  SeedkeeperError,
  SeedkeeperRefused,
  SeedTimeout,
  Unreachable,
} from "./errors.js";
import type {
  Evidence,
  EvidenceRequest,
  FunctionName,
  Health,
  KeptAlive,
  NewSnapshot,
  OwnerClaim,
  Payment,
  Receipt,
  ReceiptRequest,
  Recorded,
  SeedAnswer,
  SeedIdentity,
  SeedOptions,
  SnapshotStatus,
} from "./types.js";

/** The function answering each path, when each function has its own URL. */
export const FUNCTIONS: Readonly<Record<string, FunctionName>> = Object.freeze({
  "/seed": "seed",
  "/keepalive": "seed",
  "/receipt": "receipt",
  "/slot-evidence": "slot_evidence",
  "/snapshots": "rotation",
});

export const FINAL_TIMEOUT_MS = 300_000;
export const POLL_INTERVAL_MS = 500;
export const REQUEST_TIMEOUT_MS = 30_000;
/** The most a function URL answers with (Lambda's limit on a response, 6 MB): anything
 * longer is not Seedkeeper's answer, and is not read further (`AnswerTooLarge`). */
export const MAX_ANSWER_BYTES = 6 * 1024 * 1024;

export interface Credentials {
  accessKeyId: string;
  secretAccessKey: string;
  sessionToken?: string;
}

/** What sends a signed request: the global `fetch` unless told another (a Worker's service
 * binding's, say). */
export type Fetch = (request: Request, init?: RequestInit) => Promise<Response>;

export interface ClientOptions {
  /** One URL for every route (the local stack), or one per function as a deployment
   * outputs them: `https:` (`http:` for a local stack), without a user name, password,
   * query or fragment. */
  baseUrl: string | Partial<Record<FunctionName, string>>;
  /** Keys, or a function giving them anew for each request (temporary credentials). */
  credentials: Credentials | (() => Credentials | Promise<Credentials>);
  /** The region the function URLs are in (default us-east-1): a signature for another
   * region is refused with 403. */
  region?: string;
  /** How long one request may take before it is abandoned (default 30 000). */
  requestTimeoutMs?: number;
  fetch?: Fetch;
}

type Method = "GET" | "POST" | "DELETE";

export class SeedkeeperClient {
  readonly #urls: string | Partial<Record<FunctionName, string>>;
  readonly #credentials: ClientOptions["credentials"];
  readonly #region: string;
  readonly #requestTimeoutMs: number;
  readonly #fetch: Fetch | undefined;
  // Made once for fixed keys, so their signing key is derived once a day, not per call.
  readonly #signer: AwsClient | undefined;

  constructor(options: ClientOptions) {
    const urls = options.baseUrl;
    if (typeof urls === "string") {
      checkBase(urls, "the base URL (baseUrl)");
    } else {
      for (const [name, url] of Object.entries(urls)) {
        // a key of the caller's is named only when it is a function's (it could be anything)
        const known = Object.values(FUNCTIONS).includes(name as FunctionName);
        checkBase(url, known ? `the ${name} URL (baseUrl.${name})` : "a baseUrl entry");
      }
    }
    this.#urls = typeof urls === "string" ? urls : { ...urls };
    this.#credentials = options.credentials;
    this.#region = options.region ?? "us-east-1";
    this.#requestTimeoutMs = options.requestTimeoutMs ?? REQUEST_TIMEOUT_MS;
    this.#fetch = options.fetch;
    const keys = options.credentials;
    this.#signer = typeof keys === "function" ? undefined : signerFor(keys, this.#region);
  }

  // -- seeding ------------------------------------------------------------------------------

  /** Seed (or poll) `slot` (`seed` null: a cold slot); with `wait`, poll until the answer
   * is no longer seeding. The same call on the owner's parked slot resumes it from its
   * checkpoint (`resumed` in the answer; a Seeded's `from` is then "checkpoint"). */
  async seed(
    slot: string,
    seed: SeedIdentity | null,
    options: SeedOptions = {},
  ): Promise<SeedAnswer> {
    const claim = options.claim ?? null;
    const body = {
      slot,
      seed: seed ? withoutNulls(seed) : null,
      claim: claim ? claimBody(claim) : null,
      origin: options.origin ?? null,
    };
    const timeoutMs = options.timeoutMs ?? FINAL_TIMEOUT_MS;
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const answer = answers.seedAnswer(await this.#call("POST", "/seed", body), claim, slot);
      if (!(options.wait && isSeeding(answer))) return answer;
      if (Date.now() > deadline) {
        throw new SeedTimeout(`slot ${slot} still seeding after ${timeoutMs} ms`);
      }
      await sleep(options.intervalMs ?? POLL_INTERVAL_MS);
    }
  }

  /** Extend `slot`'s idle deadline without a seed body (`claim` null: a cold slot's). A
   * slot being checkpointed is asked back, as a poll asks: `frozen` until it runs. */
  async keepalive(slot: string, claim: OwnerClaim | null): Promise<KeptAlive> {
    const body = { slot, claim: claim ? claimBody(claim) : null };
    return answers.keptAlive(await this.#call("POST", "/keepalive", body), slot, claim ?? null);
  }

  async receipt(slot: string, request: ReceiptRequest): Promise<Receipt> {
    const body = {
      slot,
      claim: claimBody(request.claim),
      seed: withoutNulls(request.seed),
      incarnation: request.incarnation,
    };
    return parse(answers.receipt, await this.#call("POST", "/receipt", body));
  }

  async slotEvidence(slot: string, request: EvidenceRequest): Promise<Evidence> {
    const body = { slot, claim: claimBody(request.claim) };
    return parse(answers.evidence, await this.#call("POST", "/slot-evidence", body));
  }

  // -- snapshots ----------------------------------------------------------------------------

  /** Record a snapshot whose archives are already in R2, and rotate. */
  async publish(snapshot: NewSnapshot): Promise<Recorded> {
    return parse(answers.recorded, await this.#call("POST", "/snapshots", withoutNulls(snapshot)));
  }

  async snapshotStatus(resource: string): Promise<SnapshotStatus> {
    return parse(
      answers.snapshotStatus,
      await this.#call("GET", `/snapshots/${segment(resource)}`),
    );
  }

  /** Every object gone: a Payment. While R2 still owes some: SeedkeeperRefused 503 (repeat). */
  async deleteSnapshots(resource: string): Promise<Payment> {
    return parse(answers.payment, await this.#call("DELETE", `/snapshots/${segment(resource)}`));
  }

  async healthz(fn: FunctionName = "seed"): Promise<Health> {
    return parse(answers.health, await this.#call("GET", "/healthz", undefined, fn));
  }

  // -- plumbing -----------------------------------------------------------------------------

  #url(path: string, fn: FunctionName | undefined): string {
    if (typeof this.#urls === "string") return trimmed(this.#urls) + path;
    const name = fn ?? Object.entries(FUNCTIONS).find(([prefix]) => path.startsWith(prefix))?.[1];
    const base = name === undefined ? undefined : this.#urls[name];
    if (base === undefined)
      throw new SeedkeeperError(`no URL for the ${name ?? "unknown"} function`);
    return trimmed(base) + path;
  }

  async #keys(): Promise<Credentials> {
    const keys = this.#credentials;
    return typeof keys === "function" ? await keys() : keys;
  }

  /** The answer's JSON; any status but a 2xx (a redirect too: it is never followed, so the
   * signed headers go nowhere else) throws SeedkeeperRefused, and an answer longer than
   * MAX_ANSWER_BYTES AnswerTooLarge. */
  async #call(method: Method, path: string, body?: unknown, fn?: FunctionName): Promise<unknown> {
    const url = this.#url(path, fn);
    const signer = this.#signer ?? signerFor(await this.#keys(), this.#region);
    const request = await signer.sign(url, {
      method,
      redirect: "manual", // the request itself, whatever fetch sends it
      ...(body === undefined
        ? {}
        : { body: JSON.stringify(body), headers: { "Content-Type": "application/json" } }),
    });
    const send: Fetch = this.#fetch ?? ((r, init) => fetch(r, init));
    let response: Response;
    let text: string;
    try {
      response = await send(request, {
        redirect: "manual",
        signal: AbortSignal.timeout(this.#requestTimeoutMs),
      });
      text = await bounded(response);
    } catch (failed) {
      if (failed instanceof AnswerTooLarge) throw failed;
      throw new Unreachable(`no answer: ${causeOf(failed)}`);
    }
    // an opaque redirect (a browser's manual one) has status 0: a refusal like any non-2xx
    if (response.status < 200 || response.status >= 300) throw refusal(response.status, text);
    try {
      return JSON.parse(text) as unknown;
    } catch {
      const type = response.headers.get("Content-Type") ?? "none";
      throw new BadAnswer(
        `the answer (${response.status}, Content-Type ${type.slice(0, 60)}) is not JSON`,
      );
    }
  }
}

function signerFor(keys: Credentials, region: string): AwsClient {
  return new AwsClient({
    accessKeyId: keys.accessKeyId,
    secretAccessKey: keys.secretAccessKey,
    ...(keys.sessionToken === undefined ? {} : { sessionToken: keys.sessionToken }),
    service: "lambda",
    region,
    retries: 0, // a 503 is the caller's to see (retry-later), as in the Python client
  });
}

/** The answer's text, read as a stream no further than MAX_ANSWER_BYTES: past it (or when
 * its Content-Length says it goes past it) the stream is cancelled, which hangs up, and
 * AnswerTooLarge thrown. Bytes are counted, not characters. */
async function bounded(response: Response): Promise<string> {
  const stream = response.body;
  const declared = response.headers.get("Content-Length")?.trim();
  if (declared !== undefined && /^\d+$/.test(declared) && Number(declared) > MAX_ANSWER_BYTES) {
    stream?.cancel().catch(() => undefined);
    throw tooLarge();
  }
  if (stream === null) return "";
  const reader = stream.getReader();
  const decoder = new TextDecoder();
  let read = 0;
  let text = "";
  for (;;) {
    const { done, value } = await reader.read();
    if (done) return text + decoder.decode();
    read += value.byteLength;
    if (read > MAX_ANSWER_BYTES) {
      reader.cancel().catch(() => undefined);
      throw tooLarge();
    }
    text += decoder.decode(value, { stream: true });
  }
}

function tooLarge(): AnswerTooLarge {
  return new AnswerTooLarge(`the answer is longer than ${MAX_ANSWER_BYTES} bytes`);
}

function refusal(status: number, text: string): SeedkeeperRefused {
  let detail: unknown;
  try {
    detail = JSON.parse(text);
  } catch {
    detail = { error: text.slice(0, 200) };
  }
  const body = isPlainObject(detail) ? detail : { error: JSON.stringify(detail).slice(0, 200) };
  const reason = body["error"] || body["message"] || "unknown";
  return new SeedkeeperRefused(status, String(reason), body);
}

function parse<T>(check: Check<T>, answer: unknown): T {
  return check(answer, "body");
}

function claimBody(claim: OwnerClaim): OwnerClaim {
  const { run, requester, thread, repository, ref, head } = claim;
  return { run, requester, thread, repository, ref, head };
}

/** A request model as the Python client dumps it: no field that is null or absent. */
function withoutNulls<T extends object>(value: T): Partial<T> {
  const kept: Record<string, unknown> = {};
  for (const [name, item] of Object.entries(value)) {
    if (item === null || item === undefined) continue;
    kept[name] = isPlainObject(item) ? withoutNulls(item) : item;
  }
  return kept as Partial<T>;
}

/** One path segment, whatever the name holds (a `/` included). */
function segment(name: string): string {
  return encodeURIComponent(name).replace(
    /[!'()*]/g,
    (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`,
  );
}

function trimmed(base: string): string {
  return base.replace(/\/+$/, "");
}

/** A base URL a signed request may go to: http: or https: only (never file:, data:, ftp:
 * and the like), no credentials in it. `what` names the option; the URL is never named. */
function checkBase(url: unknown, what: string): void {
  let parsed: URL;
  try {
    parsed = new URL(String(url));
  } catch {
    throw new SeedkeeperError(`${what} is not a URL`);
  }
  if (parsed.protocol !== "https:" && parsed.protocol !== "http:") {
    throw new SeedkeeperError(`${what} is not an http: or https: URL`);
  }
  if (parsed.username || parsed.password) {
    throw new SeedkeeperError(`${what} has a user name or password`);
  }
  if (parsed.search || parsed.hash) throw new SeedkeeperError(`${what} has a query or a fragment`);
}

/** What made a request fail, by name or code only: a message may name the host. */
function causeOf(failed: unknown): string {
  if (!(failed instanceof Error)) return "unknown";
  const cause: unknown = failed.cause;
  const code =
    isPlainObject(cause) || cause instanceof Error ? (cause as { code?: unknown }).code : undefined;
  if (typeof code === "string" && /^[A-Z0-9_]{1,40}$/.test(code)) return code;
  return failed.name;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
