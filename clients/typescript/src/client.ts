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
  /** Keys, or a function giving them anew for each request (temporary credentials); both
   * keys non-empty strings. */
  credentials: Credentials | (() => Credentials | Promise<Credentials>);
  /** The region the function URLs are in (default us-east-1): a signature for another
   * region is refused with 403. */
  region?: string;
  /** How long one request may take, its answer's body read to the end, before it is
   * abandoned (default 30 000). */
  requestTimeoutMs?: number;
  fetch?: Fetch;
}

type Method = "GET" | "POST" | "DELETE";

export class SeedkeeperClient {
  readonly #urls: string | Partial<Record<FunctionName, string>>;
  readonly #signer: () => Promise<AwsClient>;
  readonly #requestTimeoutMs: number;
  readonly #fetch: Fetch | undefined;

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
    this.#requestTimeoutMs = options.requestTimeoutMs ?? REQUEST_TIMEOUT_MS;
    this.#fetch = options.fetch;
    const region = options.region ?? "us-east-1";
    const credentials = options.credentials;
    if (typeof credentials === "function") {
      this.#signer = async () => signerFor(await provided(credentials), region);
    } else {
      // made once for fixed keys, so their signing key is derived once a day, not per call
      const signer = signerFor(credentials, region);
      this.#signer = async () => signer;
    }
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
      if (!(options.wait && answers.isSeeding(answer))) return answer;
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
    return answers.receipt(await this.#call("POST", "/receipt", body), "body");
  }

  async slotEvidence(slot: string, request: EvidenceRequest): Promise<Evidence> {
    const body = { slot, claim: claimBody(request.claim) };
    return answers.evidence(await this.#call("POST", "/slot-evidence", body), "body");
  }

  // -- snapshots ----------------------------------------------------------------------------

  /** Record a snapshot whose archives are already in R2, and rotate. */
  async publish(snapshot: NewSnapshot): Promise<Recorded> {
    const body = withoutNulls(snapshot);
    return answers.recorded(await this.#call("POST", "/snapshots", body), "body");
  }

  async snapshotStatus(resource: string): Promise<SnapshotStatus> {
    const path = `/snapshots/${segment(resource)}`;
    return answers.snapshotStatus(await this.#call("GET", path), "body");
  }

  /** Every object gone: a Payment. While R2 still owes some: SeedkeeperRefused 503 (repeat). */
  async deleteSnapshots(resource: string): Promise<Payment> {
    const path = `/snapshots/${segment(resource)}`;
    return answers.payment(await this.#call("DELETE", path), "body");
  }

  async healthz(fn: FunctionName = "seed"): Promise<Health> {
    return answers.health(await this.#call("GET", "/healthz", undefined, fn), "body");
  }

  // -- plumbing -----------------------------------------------------------------------------

  #url(path: string, fn: FunctionName | undefined): string {
    if (typeof this.#urls === "string") return trimmed(this.#urls) + path;
    const name = fn ?? Object.entries(FUNCTIONS).find(([prefix]) => path.startsWith(prefix))?.[1];
    // own entries only: healthz("constructor") is a function without a URL, not Object's
    const urls = this.#urls;
    const base = name !== undefined && Object.hasOwn(urls, name) ? urls[name] : undefined;
    if (base === undefined) {
      throw new SeedkeeperError(`no URL given for the ${name ?? "unknown"} function`);
    }
    return trimmed(base) + path;
  }

  /** The answer's JSON; any status but a 2xx (a redirect too: it is never followed, so the
   * signed headers go nowhere else) throws SeedkeeperRefused, and an answer longer than
   * MAX_ANSWER_BYTES AnswerTooLarge. */
  async #call(method: Method, path: string, body?: unknown, fn?: FunctionName): Promise<unknown> {
    const url = this.#url(path, fn);
    const signer = await this.#signer();
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
      response = await send(request, { signal: AbortSignal.timeout(this.#requestTimeoutMs) });
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

/** A signer for `keys`, once both are non-empty strings (the caller's may be anything). */
function signerFor(keys: unknown, region: string): AwsClient {
  if (!hasKeys(keys)) throw new SeedkeeperError("no AWS credentials to sign with");
  return new AwsClient({
    accessKeyId: keys.accessKeyId,
    secretAccessKey: keys.secretAccessKey,
    ...(keys.sessionToken === undefined ? {} : { sessionToken: keys.sessionToken }),
    service: "lambda",
    region,
  });
}

function hasKeys(keys: unknown): keys is Credentials {
  const filled = (key: unknown) => typeof key === "string" && key !== "";
  return isPlainObject(keys) && filled(keys["accessKeyId"]) && filled(keys["secretAccessKey"]);
}

/** The keys a credentials function gives. Its failure is named by its name only: its
 * message may name a role or an account. */
async function provided(credentials: () => Credentials | Promise<Credentials>): Promise<unknown> {
  try {
    return await credentials();
  } catch (failed) {
    throw new SeedkeeperError(`the credentials function failed: ${causeOf(failed)}`);
  }
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

/** A refusal's reason is its JSON's own token only: a proxy's page or a redirect's text may
 * name a host, and the reason is printed (in the message) where the body is not. */
function refusal(status: number, text: string): SeedkeeperRefused {
  // Seedkeeper never redirects: a redirect's body is not its refusal
  if (status < 400) return new SeedkeeperRefused(status, "redirected", {});
  let detail: unknown;
  try {
    detail = JSON.parse(text);
  } catch {
    return new SeedkeeperRefused(status, "unknown", { error: text.slice(0, 200) });
  }
  if (!isPlainObject(detail)) {
    const error = JSON.stringify(detail).slice(0, 200);
    return new SeedkeeperRefused(status, "unknown", { error });
  }
  const reason = reasonToken(detail["error"]) || reasonToken(detail["message"]) || "unknown";
  return new SeedkeeperRefused(status, reason, detail);
}

/** A string cut to 64 characters (code points, as Python counts) without control
 * characters, so a reason is one short line; anything else "". */
function reasonToken(value: unknown): string {
  if (typeof value !== "string") return "";
  return [...value.replace(/\p{Cc}/gu, "")].slice(0, 64).join("");
}

/** Only the claim's own fields, whatever else the caller's object holds. */
function claimBody(claim: OwnerClaim): OwnerClaim {
  const fields = answers.CLAIM_FIELDS.map((field) => [field, claim[field]]);
  return Object.fromEntries(fields) as OwnerClaim;
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
 * and the like), no credentials, query or fragment in it (the route is appended: it would
 * land in them). `what` names the option; the URL is never named. */
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
  // `?` or `#` anywhere: an empty query or fragment ("http://x/?") leaves `search` empty
  if (/[?#]/.test(String(url))) throw new SeedkeeperError(`${what} has a query or a fragment`);
}

/** What made a request fail, by name or code only: a message may name the host. */
function causeOf(failed: unknown): string {
  if (!(failed instanceof Error)) return "unknown";
  const cause: unknown = failed.cause;
  const code = isPlainObject(cause) ? cause["code"] : undefined;
  if (typeof code === "string" && /^[A-Z0-9_]{1,40}$/.test(code)) return code;
  return failed.name;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
