// @ts-check
// The client against a fake function URL (node:http): every claim check, the refusal
// mapping, the routes and bodies, and every request's SigV4 signature checked by a verifier
// of its own (node:crypto, not aws4fetch). Nothing here reaches the network beyond 127.0.0.1.

import assert from "node:assert/strict";
import { createHash, createHmac } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { createServer } from "node:http";
import { after, afterEach, before, beforeEach, describe, it } from "node:test";

import {
  AnswerTooLarge,
  BadAnswer,
  ClaimNotEchoed,
  MAX_ANSWER_BYTES,
  SeedkeeperClient,
  SeedkeeperError,
  SeedkeeperRefused,
  SeedTimeout,
  Unreachable,
  isCold,
  isNotSeeded,
  isSeeded,
  isSeeding,
} from "seedkeeper-client";

const KEYS = { accessKeyId: "AKIDFAKEEXECUTOR", secretAccessKey: "fake-secret-0123456789" };

/** @type {import("seedkeeper-client").OwnerClaim} */
const CLAIM = {
  run: "run-1",
  requester: "alice",
  thread: "thread-1",
  repository: "acme/widgets",
  ref: "main",
  head: "a".repeat(40),
};

/** @type {import("seedkeeper-client").SeedIdentity} */
const SEED = {
  resource: "widgets",
  ref: "main",
  sha: "a".repeat(40),
  checkout_backup_id: "widgets-checkout-1",
  deps_backup_id: null,
};

const INCARNATION = "local:slot-1:1";

/**
 * @typedef {{method: string, path: string, rawHeaders: string[], body: string}} Seen
 * @typedef {{accessKeyId: string, secretAccessKey: string, region?: string}} Signer
 * @typedef {import("node:http").ServerResponse} Reply
 * @typedef {{
 *   status: number,
 *   body: unknown,
 *   raw?: string,
 *   type?: string,
 *   headers?: Record<string, string>,
 *   send?: (response: Reply) => void,
 * }} Answer
 */

/**
 * A fake function URL: answers from a queue (the last one repeats), records each request,
 * and recomputes each one's signature for `signer`. A request it does not hold for is
 * answered 403, as a function URL answers it, and kept in `badlySigned`, which the tests
 * require to be empty after each test.
 */
class FakeUrl {
  /** @type {Seen[]} */ seen = [];
  /** @type {Answer[]} */ answers = [];
  /** @type {Signer} */ signer = KEYS;
  /** @type {string[]} */ badlySigned = [];
  server = createServer((request, response) => {
    /** @type {Buffer[]} */
    const chunks = [];
    request.on("data", (chunk) => chunks.push(chunk));
    request.on("end", () => {
      /** @type {Seen} */
      const seen = {
        method: request.method ?? "",
        path: request.url ?? "",
        rawHeaders: request.rawHeaders,
        body: Buffer.concat(chunks).toString("utf8"),
      };
      this.seen.push(seen);
      try {
        verifySigV4(seen, this.signer);
      } catch (failed) {
        this.badlySigned.push(`${seen.method} ${seen.path}: ${String(failed)}`);
        response.writeHead(403, { "Content-Type": "application/json" });
        return response.end(JSON.stringify({ message: "the signature does not hold" }));
      }
      const answer = this.answers.length > 1 ? this.answers.shift() : this.answers[0];
      if (answer === undefined) throw new Error("no answer queued");
      if (answer.send) return answer.send(response);
      const text = answer.raw ?? JSON.stringify(answer.body);
      response.writeHead(answer.status, {
        "Content-Type": answer.type ?? "application/json",
        ...answer.headers,
      });
      response.end(text);
    });
  });
  url = "";

  async start() {
    await new Promise((resolve) => this.server.listen(0, "127.0.0.1", () => resolve(null)));
    const address = this.server.address();
    if (address === null || typeof address === "string") throw new Error("no port");
    this.url = `http://127.0.0.1:${address.port}`;
    return this;
  }

  /** @param {...Answer} answers */
  answer(...answers) {
    this.answers = answers;
    this.seen = [];
  }

  stop() {
    this.server.closeAllConnections();
    return new Promise((resolve) => this.server.close(() => resolve(null)));
  }

  /** @returns {Seen} */
  get last() {
    const seen = this.seen.at(-1);
    assert.ok(seen, "no request arrived");
    return seen;
  }
}

/** @param {string} slot @param {object} [changes] */
function seeding(slot, changes = {}) {
  return { state: "seeding", slot, attempt: 1, incarnation: INCARNATION, claim: CLAIM, ...changes };
}

/** @param {object} [changes] */
function seeded(changes = {}) {
  return {
    seeded: true,
    cached: true,
    ref: "main",
    sha: "a".repeat(40),
    from: "seed",
    steps: { download: 12, extract: 30 },
    ms: 42,
    incarnation: INCARNATION,
    claim: CLAIM,
    frozen: false,
    ...changes,
  };
}

/** @param {string} slot @param {object} [changes] */
function cold(slot, changes = {}) {
  return {
    state: "unseeded",
    seeded: false,
    slot,
    attempt: 1,
    incarnation: INCARNATION,
    claim: null,
    ...changes,
  };
}

/** @param {string} slot @param {object} [changes] */
function keptAlive(slot, changes = {}) {
  return {
    slot,
    claim: CLAIM,
    state: "seeded",
    idle_deadline: 1_800_000_000,
    frozen: false,
    ...changes,
  };
}

/**
 * An answer written in 64 KiB chunks of `x` until `total` bytes (for ever by default),
 * with `declared` as its Content-Length (none: chunked). An answer that declares more
 * than it has sent is held open. `sent` says how much went out and whether the client
 * hung up (`closed` resolves then).
 * @param {number} status
 * @param {{total?: number, declared?: number}} [options]
 */
function streamed(status, { total = Infinity, declared } = {}) {
  const sent = { bytes: 0, hungUp: false };
  /** @type {(value: null) => void} */
  let hungUp = () => {};
  /** @type {Promise<null>} */
  const closed = new Promise((resolve) => (hungUp = resolve));
  /** @type {Answer} */
  const answer = {
    status,
    body: null,
    send(response) {
      response.on("error", () => {});
      response.on("close", () => {
        sent.hungUp = !response.writableFinished;
        hungUp(null);
      });
      response.writeHead(status, {
        "Content-Type": "application/json",
        ...(declared === undefined ? {} : { "Content-Length": String(declared) }),
      });
      const chunk = Buffer.alloc(64 * 1024, "x");
      const pump = () => {
        while (sent.bytes < total && !response.destroyed) {
          const part = chunk.subarray(0, Math.min(chunk.length, total - sent.bytes));
          sent.bytes += part.length;
          if (!response.write(part)) return void response.once("drain", pump);
        }
        if (sent.bytes >= total && (declared === undefined || declared === total)) response.end();
      };
      pump();
    },
  };
  return { answer, sent, closed };
}

/**
 * `promise`, or a rejection after `ms`.
 * @template T
 * @param {Promise<T>} promise
 * @param {number} ms
 */
function within(promise, ms) {
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  let timer;
  const late = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`not within ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

// -- an independent SigV4 verifier (service lambda) --------------------------------------------

/** @param {string} s */
const rfc3986 = (s) =>
  encodeURIComponent(s).replace(
    /[!'()*]/g,
    (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`,
  );

/**
 * Recompute the signature of a request as AWS does for service lambda (each path segment
 * encoded once more, the signed headers as they arrived, the body's sha256) and compare.
 * @param {Seen} seen
 * @param {Signer} signer
 */
function verifySigV4(seen, { accessKeyId, secretAccessKey, region = "us-east-1" }) {
  /** @type {Map<string, string[]>} */
  const headers = new Map();
  for (let i = 0; i < seen.rawHeaders.length; i += 2) {
    const name = String(seen.rawHeaders[i]).toLowerCase();
    headers.set(name, [...(headers.get(name) ?? []), String(seen.rawHeaders[i + 1])]);
  }
  const authorization = headers.get("authorization") ?? [];
  assert.equal(authorization.length, 1, "one Authorization header");
  const match =
    /^AWS4-HMAC-SHA256 Credential=([^/]+)\/(\d{8})\/([^/]+)\/([^/]+)\/aws4_request, SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})$/.exec(
      authorization[0] ?? "",
    );
  assert.ok(match, "a SigV4 Authorization header");
  const [, keyId, date, scopeRegion, scopeService, signedHeaders, signature] = match;
  assert.equal(keyId, accessKeyId);
  assert.equal(scopeService, "lambda");
  assert.equal(scopeRegion, region);
  const stamp = (headers.get("x-amz-date") ?? [])[0] ?? "";
  assert.match(stamp, /^\d{8}T\d{6}Z$/);
  assert.equal(stamp.slice(0, 8), date);
  const signed = String(signedHeaders).split(";");
  assert.ok(signed.includes("host") && signed.includes("x-amz-date"), "host and date signed");
  const canonicalHeaders = signed
    .map(
      (name) =>
        `${name}:${(headers.get(name) ?? []).map((v) => v.trim().replace(/\s+/g, " ")).join(",")}\n`,
    )
    .join("");
  const [path = "", query = ""] = seen.path.split("?");
  const canonicalPath = path.split("/").map(rfc3986).join("/");
  const canonical = [
    seen.method,
    canonicalPath,
    query,
    canonicalHeaders,
    signedHeaders,
    createHash("sha256").update(seen.body).digest("hex"),
  ].join("\n");
  const toSign = [
    "AWS4-HMAC-SHA256",
    stamp,
    `${date}/${scopeRegion}/${scopeService}/aws4_request`,
    createHash("sha256").update(canonical).digest("hex"),
  ].join("\n");
  /** @param {string | Buffer} key @param {string} data */
  const hmac = (key, data) => createHmac("sha256", key).update(data).digest();
  let key = hmac(`AWS4${secretAccessKey}`, String(date));
  for (const part of [String(scopeRegion), String(scopeService), "aws4_request"])
    key = hmac(key, part);
  // assert.ok, not equal: a failure must not print a signature
  assert.ok(
    createHmac("sha256", key).update(toSign).digest("hex") === signature,
    "the signature holds",
  );
  return headers;
}

// -- the tests ------------------------------------------------------------------------------------

describe("SeedkeeperClient against a fake function URL", { timeout: 60_000 }, () => {
  const fake = new FakeUrl();
  /** @type {SeedkeeperClient} */
  let client;

  before(async () => {
    await fake.start();
    client = new SeedkeeperClient({ baseUrl: fake.url, credentials: KEYS });
  });
  after(() => fake.stop());
  beforeEach(() => {
    fake.answer({ status: 500, body: { error: "nothing-queued" } });
    fake.signer = KEYS;
  });
  afterEach(() => assert.deepEqual(fake.badlySigned.splice(0), [], "every request signed"));

  describe("signing", () => {
    it("signs a POST with SigV4 for service lambda in us-east-1, the body included", async () => {
      fake.answer({ status: 202, body: seeding("slot-1") });
      await client.seed("slot-1", SEED, { claim: CLAIM, origin: "https://git.example.com/a.git" });
      const headers = verifySigV4(fake.last, KEYS);
      assert.equal(headers.get("content-type")?.[0], "application/json");
      assert.equal(headers.has("x-amz-security-token"), false);
    });

    it("signs a GET without a body, an escaped path segment included", async () => {
      fake.answer({ status: 404, body: { error: "not-found" } });
      await assert.rejects(client.snapshotStatus("a b/c"), SeedkeeperRefused);
      assert.equal(fake.last.method, "GET");
      assert.equal(fake.last.path, "/snapshots/a%20b%2Fc");
    });

    it("signs for the region it is given, with the session token of temporary keys", async () => {
      const temporary = { ...KEYS, sessionToken: "session-token-1" };
      const other = new SeedkeeperClient({
        baseUrl: fake.url,
        credentials: async () => temporary,
        region: "eu-west-1",
      });
      fake.signer = { ...temporary, region: "eu-west-1" };
      fake.answer({ status: 200, body: keptAlive("slot-1", { claim: null }) });
      await other.keepalive("slot-1", null);
      const headers = verifySigV4(fake.last, fake.signer);
      assert.equal(headers.get("x-amz-security-token")?.[0], "session-token-1");
      const authorization = headers.get("authorization")?.[0] ?? "";
      assert.ok(
        /SignedHeaders=[^,]*x-amz-security-token/.test(authorization),
        "the token is signed",
      );
    });

    it("is answered 403 by the fake when signed with another secret", async () => {
      const forged = new SeedkeeperClient({
        baseUrl: fake.url,
        credentials: { ...KEYS, secretAccessKey: "not-the-secret" },
      });
      fake.answer({ status: 200, body: { ok: true, build: "x", backupTransfer: "r2" } });
      await assert.rejects(forged.healthz(), { status: 403 });
      assert.equal(fake.badlySigned.splice(0).length, 1, "the fake saw it");
    });
  });

  describe("credentials", () => {
    const NONE = "no AWS credentials to sign with";
    const missing = [
      { accessKeyId: undefined, secretAccessKey: KEYS.secretAccessKey },
      { accessKeyId: KEYS.accessKeyId, secretAccessKey: "" },
      { accessKeyId: "", secretAccessKey: "" },
      { accessKeyId: 1, secretAccessKey: KEYS.secretAccessKey },
      {},
      null,
      undefined,
    ];

    it("refuses keys that are missing or empty when the client is made", () => {
      for (const keys of missing) {
        assert.throws(
          () => new SeedkeeperClient({ baseUrl: fake.url, credentials: /** @type {any} */ (keys) }),
          (error) => error instanceof SeedkeeperError && error.message === NONE,
          JSON.stringify(keys),
        );
      }
    });

    it("refuses a credentials function's missing or empty keys, sending nothing", async () => {
      for (const keys of missing) {
        const unsigned = new SeedkeeperClient({
          baseUrl: fake.url,
          credentials: async () => /** @type {any} */ (keys),
        });
        await assert.rejects(
          unsigned.healthz(),
          (error) => error instanceof SeedkeeperError && error.message === NONE,
          JSON.stringify(keys),
        );
      }
      assert.deepEqual(fake.seen, []);
    });

    it("wraps a credentials function's failure without repeating its message", async () => {
      const role = "arn:aws:iam::123456789012:role/secret-role";
      for (const provider of [
        () => {
          throw new Error(`cannot assume ${role}`);
        },
        async () => Promise.reject(new TypeError(`expired: ${role}`)),
      ]) {
        const failing = new SeedkeeperClient({ baseUrl: fake.url, credentials: provider });
        const error = await failing.healthz().catch((e) => e);
        assert.ok(error instanceof SeedkeeperError, String(error));
        assert.match(error.message, /^the credentials function failed: (Error|TypeError)$/);
        assert.ok(!String(error.stack).includes(role), "the provider's message is not repeated");
        assert.equal(error.cause, undefined);
      }
      assert.deepEqual(fake.seen, []);
    });
  });

  describe("seed", () => {
    it("sends the slot, the seed without its null fields, the claim and the origin", async () => {
      fake.answer({ status: 202, body: seeding("slot-1") });
      const answer = await client.seed("slot-1", SEED, {
        claim: CLAIM,
        origin: "https://git.example.com/a.git",
      });
      assert.equal(fake.last.method, "POST");
      assert.equal(fake.last.path, "/seed");
      assert.deepEqual(JSON.parse(fake.last.body), {
        slot: "slot-1",
        seed: {
          resource: "widgets",
          ref: "main",
          sha: "a".repeat(40),
          checkout_backup_id: "widgets-checkout-1",
        },
        claim: CLAIM,
        origin: "https://git.example.com/a.git",
      });
      assert.ok(isSeeding(answer));
      assert.equal(answer.resumed, false, "a default is filled in");
    });

    it("fills in a seeding answer's state, as the Python model does", async () => {
      const { state, ...stateless } = seeding("slot-1");
      fake.answer({ status: 202, body: stateless });
      const answer = await client.seed("slot-1", SEED, { claim: CLAIM });
      assert.ok(isSeeding(answer));
      assert.equal(answer.state, state);
    });

    it("sends null for a cold slot's seed, claim and origin", async () => {
      fake.answer({ status: 200, body: cold("cold-1", { incarnation: null }) });
      const answer = await client.seed("cold-1", null);
      assert.deepEqual(JSON.parse(fake.last.body), {
        slot: "cold-1",
        seed: null,
        claim: null,
        origin: null,
      });
      assert.ok(isCold(answer));
      assert.equal(answer.claim, null);
    });

    it("with wait, polls while seeding and returns the seeded answer", async () => {
      fake.answer(
        { status: 202, body: seeding("slot-1") },
        { status: 202, body: seeding("slot-1") },
        { status: 200, body: seeded() },
      );
      const answer = await client.seed("slot-1", SEED, {
        claim: CLAIM,
        wait: true,
        timeoutMs: 5000,
        intervalMs: 1,
      });
      assert.equal(fake.seen.length, 3);
      assert.ok(new Set(fake.seen.map((seen) => seen.body)).size === 1, "the same body each poll");
      assert.ok(isSeeded(answer));
      assert.equal(answer.from, "seed");
      assert.deepEqual(answer.steps, { download: 12, extract: 30 });
      assert.equal(answer.resumed, false);
    });

    it("without wait, returns the seeding answer after one call", async () => {
      fake.answer({ status: 202, body: seeding("slot-1") }, { status: 200, body: seeded() });
      assert.ok(isSeeding(await client.seed("slot-1", SEED, { claim: CLAIM })));
      assert.equal(fake.seen.length, 1);
    });

    it("with wait, throws SeedTimeout when still seeding past the timeout", async () => {
      fake.answer({ status: 202, body: seeding("slot-1") });
      await assert.rejects(
        client.seed("slot-1", SEED, { claim: CLAIM, wait: true, timeoutMs: 30, intervalMs: 5 }),
        (error) => error instanceof SeedTimeout && /slot-1 still seeding/.test(error.message),
      );
      assert.ok(fake.seen.length >= 2);
    });

    it("returns a NotSeeded answer as it is, claimed or not, with its defaults", async () => {
      fake.answer({ status: 200, body: { seeded: false, reason: "seed-missing" } });
      const answer = await client.seed("slot-1", SEED, {
        claim: CLAIM,
        wait: true,
        timeoutMs: 1000,
      });
      assert.ok(isNotSeeded(answer));
      assert.deepEqual(answer, { seeded: false, reason: "seed-missing", step: null, detail: null });
      fake.answer({
        status: 200,
        body: { seeded: false, reason: "lost", step: "task-stopped", detail: "gone" },
      });
      assert.equal((await client.seed("slot-1", null)).seeded, false);
    });

    it("accepts a cold slot bound to the claim, echoed with an incarnation", async () => {
      fake.answer({ status: 200, body: cold("slot-1", { claim: CLAIM }) });
      assert.ok(isCold(await client.seed("slot-1", null, { claim: CLAIM })));
    });
  });

  describe("the claim checks of a seed answer", () => {
    const refusals = [
      [
        "a seeding answer about another slot",
        { status: 202, body: seeding("slot-2") },
        "about another slot",
      ],
      [
        "a cold answer about another slot",
        { status: 200, body: cold("slot-2", { claim: CLAIM }) },
        "about another slot",
      ],
      [
        "a seeded answer without the claim",
        { status: 200, body: seeded({ claim: null }) },
        "does not echo",
      ],
      [
        "a seeding answer without the claim",
        { status: 202, body: seeding("slot-1", { claim: null }) },
        "does not echo",
      ],
      ["a cold answer for a claimed slot", { status: 200, body: cold("slot-1") }, "does not echo"],
      [
        "a seeded answer without an incarnation",
        { status: 200, body: seeded({ incarnation: null }) },
        "does not echo",
      ],
      [
        "a seeded answer with an empty incarnation",
        { status: 200, body: seeded({ incarnation: "" }) },
        "does not echo",
      ],
      [
        "a seeding answer without an incarnation",
        { status: 202, body: seeding("slot-1", { incarnation: null }) },
        "does not echo",
      ],
      [
        "a cold answer without an incarnation",
        { status: 200, body: cold("slot-1", { claim: CLAIM, incarnation: null }) },
        "does not echo",
      ],
      ...Object.keys(CLAIM).map((field) => [
        `a seeded answer with another ${field}`,
        {
          status: 200,
          body: seeded({
            claim: { ...CLAIM, [field]: `${CLAIM[/** @type {keyof typeof CLAIM} */ (field)]}x` },
          }),
        },
        "does not echo",
      ]),
    ];
    for (const [title, answer, message] of refusals) {
      it(`refuses ${title}`, async () => {
        fake.answer(/** @type {Answer} */ (answer));
        await assert.rejects(
          client.seed("slot-1", SEED, { claim: CLAIM, wait: true, timeoutMs: 1000, intervalMs: 1 }),
          (error) => error instanceof ClaimNotEchoed && error.message.includes(String(message)),
        );
      });
    }

    it("refuses a claim in the answer to an unclaimed seed", async () => {
      fake.answer({ status: 200, body: cold("cold-1", { claim: CLAIM }) });
      await assert.rejects(client.seed("cold-1", null), ClaimNotEchoed);
      fake.answer({ status: 200, body: seeded() });
      await assert.rejects(client.seed("cold-1", SEED), ClaimNotEchoed);
    });

    it("refuses an echoed claim with a field more (not exactly this claim)", async () => {
      fake.answer({ status: 200, body: seeded({ claim: { ...CLAIM, extra: "x" } }) });
      await assert.rejects(client.seed("slot-1", SEED, { claim: CLAIM }), BadAnswer);
    });

    for (const field of ["toString", "constructor", "__proto__", "hasOwnProperty"]) {
      it(`refuses an echoed claim with a field more named ${field}, as any other`, async () => {
        // raw JSON: an object literal's __proto__ would set its prototype, not a field
        const claim = `${JSON.stringify(CLAIM).slice(0, -1)},${JSON.stringify(field)}:"x"}`;
        const raw = JSON.stringify(seeded({ claim: "CLAIM" })).replace('"CLAIM"', claim);
        fake.answer({ status: 200, body: null, raw });
        await assert.rejects(
          client.seed("slot-1", SEED, { claim: CLAIM }),
          (error) => error instanceof BadAnswer && error.message.includes(field),
        );
      });
    }

    it("compares the claim field by field, whatever else the caller's object holds", async () => {
      fake.answer({ status: 200, body: seeded() });
      const claim = Object.assign(Object.create({ inherited: 1 }), CLAIM, { note: "local" });
      assert.ok(isSeeded(await client.seed("slot-1", SEED, { claim })));
      assert.deepEqual(JSON.parse(fake.last.body).claim, CLAIM, "only the claim's fields are sent");
    });
  });

  describe("keepalive", () => {
    it("sends the slot and the claim and returns the echo", async () => {
      fake.answer({ status: 200, body: keptAlive("slot-1") });
      const answer = await client.keepalive("slot-1", CLAIM);
      assert.equal(fake.last.path, "/keepalive");
      assert.deepEqual(JSON.parse(fake.last.body), { slot: "slot-1", claim: CLAIM });
      assert.equal(answer.idle_deadline, 1_800_000_000);
    });

    it("keeps a cold slot alive with a null claim", async () => {
      fake.answer({ status: 200, body: keptAlive("cold-1", { claim: null }) });
      await client.keepalive("cold-1", null);
      assert.deepEqual(JSON.parse(fake.last.body), { slot: "cold-1", claim: null });
    });

    const refusals = [
      ["about another slot", keptAlive("slot-2"), CLAIM],
      ["without the claim", keptAlive("slot-1", { claim: null }), CLAIM],
      ["with another claim", keptAlive("slot-1", { claim: { ...CLAIM, run: "run-2" } }), CLAIM],
      ["with a claim for a cold slot", keptAlive("slot-1"), null],
    ];
    for (const [title, body, claim] of refusals) {
      it(`refuses an answer ${title}`, async () => {
        fake.answer({ status: 200, body });
        await assert.rejects(
          client.keepalive("slot-1", /** @type {any} */ (claim)),
          (error) =>
            error instanceof ClaimNotEchoed && /keepalive answer does not echo/.test(error.message),
        );
      });
    }
  });

  describe("receipt, slot evidence and snapshots", () => {
    it("asks for a receipt with the exact slot, claim, seed and incarnation", async () => {
      fake.answer({
        status: 200,
        body: { slot: "slot-1", checkpoint: "unknown", why: "no-checkpoint" },
      });
      const receipt = await client.receipt("slot-1", {
        claim: CLAIM,
        seed: SEED,
        incarnation: INCARNATION,
      });
      assert.equal(fake.last.path, "/receipt");
      assert.deepEqual(JSON.parse(fake.last.body), {
        slot: "slot-1",
        claim: CLAIM,
        seed: {
          resource: "widgets",
          ref: "main",
          sha: "a".repeat(40),
          checkout_backup_id: "widgets-checkout-1",
        },
        incarnation: INCARNATION,
      });
      assert.deepEqual(receipt, {
        slot: "slot-1",
        checkpoint: "unknown",
        why: "no-checkpoint",
        size: null,
        sha256: null,
        created_at: null,
        expires_at: null,
        parked: false,
        retention_expires_at: null,
      });
    });

    it("asks for slot evidence with the slot and claim", async () => {
      const body = {
        slot: "slot-1",
        incarnation: INCARNATION,
        state: "seeded",
        checkpoint: "unknown",
        disposition: "retained",
      };
      fake.answer({ status: 200, body: { ...body, future_field: 1 } });
      assert.deepEqual(
        await client.slotEvidence("slot-1", { claim: CLAIM }),
        body,
        "an unknown field is left out",
      );
      assert.equal(fake.last.path, "/slot-evidence");
      assert.deepEqual(JSON.parse(fake.last.body), { slot: "slot-1", claim: CLAIM });
    });

    it("publishes a snapshot without its null fields and reads the rotation", async () => {
      const checkout = { backup_id: "widgets-checkout-1", size: 10, sha256: "b".repeat(64) };
      const snapshot = {
        resource: "widgets",
        ref: "main",
        sha: "a".repeat(40),
        created_at: 1_800_000_000,
        checkout,
      };
      fake.answer({
        status: 201,
        body: {
          resource: "widgets",
          rotated: true,
          current: { ...snapshot, generation: 1 },
          retired: null,
          payment: {},
        },
      });
      const recorded = await client.publish({ ...snapshot, deps: null, lockfile_hash: null });
      assert.equal(fake.last.path, "/snapshots");
      assert.deepEqual(JSON.parse(fake.last.body), snapshot);
      assert.equal(recorded.current.generation, 1);
      assert.equal(recorded.current.deps, null);
      assert.deepEqual(recorded.payment, { deleted: [], pending: [], spared: [] });
    });

    it("reads a snapshot status and deletes a resource's snapshots", async () => {
      const handle = {
        ref: "main",
        sha: "a".repeat(40),
        checkout_backup_id: "c-1",
        deps_backup_id: null,
      };
      const status = {
        resource: "widgets",
        current: null,
        retired: null,
        seed_handle: handle,
        deps: [],
        pending_deletions: ["old-1"],
        objects: { recorded: 1, present: null },
      };
      fake.answer({ status: 200, body: status });
      assert.deepEqual(await client.snapshotStatus("widgets"), status);
      assert.equal(fake.last.path, "/snapshots/widgets");
      fake.answer({ status: 200, body: { deleted: ["c-1"], pending: [], spared: [] } });
      assert.deepEqual((await client.deleteSnapshots("widgets")).deleted, ["c-1"]);
      assert.equal(fake.last.method, "DELETE");
      assert.equal(fake.last.body, "");
    });

    it("refuses an answer of the wrong shape, naming the field", async () => {
      fake.answer({ status: 200, body: { slot: "slot-1", checkpoint: "maybe" } });
      await assert.rejects(
        client.receipt("slot-1", { claim: CLAIM, seed: SEED, incarnation: INCARNATION }),
        (error) => error instanceof BadAnswer && /body\.checkpoint/.test(error.message),
      );
      fake.answer({ status: 200, body: seeded({ ms: 1.5 }) });
      await assert.rejects(
        client.seed("slot-1", SEED, { claim: CLAIM }),
        /body\.ms is not an integer/,
      );
      fake.answer({
        status: 200,
        body: { slot: "slot-1", state: "seeded", idle_deadline: 1, frozen: false },
      });
      await assert.rejects(client.keepalive("slot-1", null), /body\.claim is not there/);
    });

    it("names the field for every route's answer (a 2xx that is not its shape)", async () => {
      const fresh = {
        resource: "widgets",
        ref: "main",
        sha: "a".repeat(40),
        created_at: 1,
        checkout: { backup_id: "c-1", size: 1, sha256: "b".repeat(64) },
      };
      const snapshot = { ...fresh, generation: 1 };
      /** @type {[string, () => Promise<unknown>, unknown, RegExp][]} */
      const cases = [
        ["seed", () => client.seed("slot-1", null), { seeded: "yes" }, /body\.seeded /],
        [
          "a cold seed",
          () => client.seed("slot-1", null),
          { state: "unseeded", slot: "slot-1" },
          /body\.attempt is not there/,
        ],
        [
          "a seeding seed",
          () => client.seed("slot-1", SEED, { claim: CLAIM }),
          seeding("slot-1", { claim: { ...CLAIM, run: 1 } }),
          /body\.claim\.run is not a string/,
        ],
        [
          "slot evidence",
          () => client.slotEvidence("slot-1", { claim: CLAIM }),
          {
            slot: "slot-1",
            incarnation: null,
            state: "x",
            checkpoint: "present",
            disposition: "gone",
          },
          /body\.disposition is not one of/,
        ],
        [
          "publish",
          () => client.publish(fresh),
          {
            resource: "widgets",
            rotated: true,
            current: fresh,
            retired: null,
            payment: {},
          },
          /body\.current\.generation is not there/,
        ],
        [
          "a snapshot status",
          () => client.snapshotStatus("widgets"),
          {
            resource: "widgets",
            current: null,
            retired: null,
            seed_handle: null,
            deps: [{ lockfile_hash: "h", archive: snapshot.checkout, generation: "1" }],
            pending_deletions: [],
            objects: { recorded: 0, present: null },
          },
          /body\.deps\[0\]\.generation is not an integer/,
        ],
        [
          "a deletion",
          () => client.deleteSnapshots("widgets"),
          { deleted: "c-1" },
          /body\.deleted is not a list/,
        ],
        [
          "healthz",
          () => client.healthz(),
          { ok: "yes", build: "b", backupTransfer: "r2" },
          /body\.ok is not a boolean/,
        ],
        ["a list", () => client.healthz(), [], /body is not an object/],
      ];
      for (const [route, call, body, field] of cases) {
        fake.answer({ status: 200, body });
        const error = await call().catch((e) => e);
        assert.ok(error instanceof BadAnswer, `${route}: ${error}`);
        assert.match(error.message, field, route);
      }
    });
  });

  describe("refusals and bad answers", () => {
    const cases = [
      ["a reason token", 409, { error: "claim-mismatch" }, "claim-mismatch"],
      [
        "every field named",
        400,
        { error: "invalid-request", fields: [{ field: "body.slot", message: "bad" }] },
        "invalid-request",
      ],
      ["a message, as a function URL refuses", 403, { message: "Forbidden" }, "Forbidden"],
      ["neither", 503, {}, "unknown"],
      ["an empty reason", 500, { error: "", message: "" }, "unknown"],
      ["a reason that is not a string", 500, { error: 42, message: ["x"] }, "unknown"],
      ["a message, the error not a string", 500, { error: { a: 1 }, message: "Gone" }, "Gone"],
      ["control characters", 400, { error: "bad\r\n\u0000\u009breason\u007f" }, "badreason"],
    ];
    for (const [title, status, body, reason] of cases) {
      it(`maps a ${status} with ${title}`, async () => {
        fake.answer({ status: Number(status), body });
        const error = await client.seed("slot-1", SEED, { claim: CLAIM }).catch((e) => e);
        assert.ok(error instanceof SeedkeeperRefused);
        assert.ok(error instanceof SeedkeeperError);
        assert.equal(error.status, status);
        assert.equal(error.reason, reason);
        assert.deepEqual(error.body, body);
        assert.equal(error.message, `${status} ${reason}`);
      });
    }

    it("cuts a reason to 64 characters", async () => {
      fake.answer({ status: 400, body: { error: "e".repeat(10_000) } });
      const error = await client.healthz().catch((e) => e);
      assert.ok(error instanceof SeedkeeperRefused);
      assert.equal(error.reason, "e".repeat(64));
      assert.equal(error.message, `400 ${"e".repeat(64)}`);
    });

    it("gives a refusal that is not JSON no reason, its text (cut) as the body", async () => {
      const page = `<html><head><title>502 Bad Gateway</title></head><body>${"x".repeat(500)}`;
      fake.answer({ status: 502, body: null, raw: page, type: "text/html" });
      const error = await client.healthz().catch((e) => e);
      assert.ok(error instanceof SeedkeeperRefused);
      assert.deepEqual(
        [error.status, error.reason, error.body],
        [502, "unknown", { error: page.slice(0, 200) }],
      );
      assert.equal(error.message, "502 unknown");
    });

    it("gives a refusal whose JSON is not an object no reason", async () => {
      fake.answer({ status: 500, body: ["x"] });
      const error = await client.healthz().catch((e) => e);
      assert.ok(error instanceof SeedkeeperRefused);
      assert.deepEqual([error.reason, error.body], ["unknown", { error: '["x"]' }]);
    });

    it("does not retry a 503 (the caller sees retry-later)", async () => {
      fake.answer({ status: 503, body: { error: "retry-later" } });
      await assert.rejects(
        client.seed("slot-1", SEED, { claim: CLAIM, wait: true, timeoutMs: 1000 }),
        { reason: "retry-later" },
      );
      assert.equal(fake.seen.length, 1);
    });

    it("refuses an answer that is not JSON, or not an object", async () => {
      fake.answer({ status: 200, body: null, raw: "<html>ok</html>", type: "text/html" });
      await assert.rejects(
        client.seed("slot-1", SEED, { claim: CLAIM }),
        (error) =>
          error instanceof BadAnswer &&
          /is not JSON/.test(error.message) &&
          /text\/html/.test(error.message),
      );
      fake.answer({ status: 200, body: [seeded()] });
      await assert.rejects(client.seed("slot-1", SEED, { claim: CLAIM }), /not a JSON object/);
      fake.answer({ status: 200, body: null, raw: "" });
      await assert.rejects(client.healthz(), BadAnswer);
    });

    it("never names the URL, a key or the signature in an error", async () => {
      const errors = [];
      for (const answer of [
        { status: 403, body: { message: "Forbidden" } },
        { status: 200, body: null, raw: "nope" },
        { status: 200, body: seeded({ claim: null }) },
        { status: 200, body: { ok: "yes" } },
        { status: 302, body: null, raw: "", headers: { Location: `${fake.url}/secret-path` } },
        streamed(200, { total: MAX_ANSWER_BYTES + 1 }).answer,
      ]) {
        fake.answer(answer);
        errors.push(await client.seed("slot-1", SEED, { claim: CLAIM }).catch((e) => e));
      }
      const closed = new SeedkeeperClient({
        baseUrl: "http://127.0.0.1:9/secret-path",
        credentials: KEYS,
      });
      errors.push(await closed.healthz().catch((e) => e));
      for (const error of errors) {
        assert.ok(error instanceof SeedkeeperError, String(error));
        const text = `${error.name} ${error.message} ${error.stack}`;
        for (const secret of [
          fake.url,
          "127.0.0.1",
          "secret-path",
          KEYS.accessKeyId,
          KEYS.secretAccessKey,
          "Signature",
          "AWS4",
        ]) {
          assert.ok(!text.includes(secret), `${error.name} names ${secret}`);
        }
      }
      assert.ok(errors.at(-1) instanceof Unreachable);
      assert.equal(errors.at(-1).cause, undefined);
    });
  });

  describe("redirects", () => {
    const elsewhere = new FakeUrl();
    before(() => elsewhere.start());
    after(() => elsewhere.stop());
    beforeEach(() =>
      elsewhere.answer({ status: 200, body: { ok: true, build: "x", backupTransfer: "r2" } }),
    );

    for (const status of [301, 302, 303, 307, 308]) {
      it(`refuses a ${status} (GET, POST): signed headers never reach the Location`, async () => {
        const redirect = {
          status,
          body: null,
          raw: "",
          headers: { Location: `${elsewhere.url}/collect` },
        };
        for (const call of [
          () => client.healthz(),
          () => client.seed("slot-1", SEED, { claim: CLAIM, wait: true, timeoutMs: 1000 }),
        ]) {
          fake.answer(redirect);
          const error = await call().catch((e) => e);
          assert.ok(error instanceof SeedkeeperRefused, `a ${status} is a refusal: ${error}`);
          assert.equal(error.status, status);
          assert.equal(error.reason, "redirected");
          assert.ok(!error.message.includes(elsewhere.url), "the Location is not named");
          assert.equal(fake.seen.length, 1, "asked once");
        }
        assert.deepEqual(elsewhere.seen, [], "nothing reached the Location's host");
      });
    }

    it("does not name the Location its text names", async () => {
      const location = `${elsewhere.url}/collect`;
      fake.answer({
        status: 302,
        body: null,
        raw: `Found. Redirecting to ${location}`,
        type: "text/plain",
        headers: { Location: location },
      });
      const error = await client.healthz().catch((e) => e);
      assert.ok(error instanceof SeedkeeperRefused, String(error));
      assert.ok(!error.message.includes(location), error.message);
      assert.equal(error.reason, "redirected");
    });

    it("takes no reason from a redirect's JSON, which may name where it points", async () => {
      const location = `${elsewhere.url}/collect`;
      fake.answer({
        status: 302,
        body: { message: `moved to ${location}` },
        headers: { Location: location },
      });
      await assert.rejects(client.healthz(), { status: 302, reason: "redirected", body: {} });
      assert.deepEqual(elsewhere.seen, []);
    });

    it("hands a fetch of the caller's a request that does not follow redirects", async () => {
      /** @type {string[]} */
      const modes = [];
      const own = new SeedkeeperClient({
        baseUrl: fake.url,
        credentials: KEYS,
        fetch: (request, init) => {
          modes.push(request.redirect);
          return fetch(request, init);
        },
      });
      fake.answer({
        status: 307,
        body: null,
        raw: "",
        headers: { Location: `${elsewhere.url}/x` },
      });
      await assert.rejects(own.healthz(), { status: 307 });
      assert.deepEqual(modes, ["manual"], "the signed request itself is manual");
      assert.deepEqual(elsewhere.seen, []);
    });
  });

  describe("answers longer than a function URL sends", () => {
    const EMPTY_HEALTH = JSON.stringify({ ok: true, build: "", backupTransfer: "r2" });
    /** A healthz answer of exactly `size` bytes. @param {number} size */
    function healthOf(size) {
      const build = "x".repeat(size - EMPTY_HEALTH.length);
      return JSON.stringify({ ok: true, build, backupTransfer: "r2" });
    }

    it("is 6 MiB (Lambda's limit), and too large is an Unreachable", () => {
      assert.equal(MAX_ANSWER_BYTES, 6 * 1024 * 1024);
      const error = new AnswerTooLarge("x");
      assert.ok(error instanceof Unreachable && error instanceof SeedkeeperError);
      assert.equal(error.name, "AnswerTooLarge");
    });

    it("reads an answer of exactly the limit", async () => {
      const raw = healthOf(MAX_ANSWER_BYTES);
      assert.equal(Buffer.byteLength(raw), MAX_ANSWER_BYTES);
      fake.answer({ status: 200, body: null, raw });
      assert.equal((await client.healthz()).build.length, MAX_ANSWER_BYTES - EMPTY_HEALTH.length);
    });

    for (const status of [200, 500]) {
      for (const declared of [false, true]) {
        const how = declared ? "declared in its Content-Length" : "sent chunked";
        it(`refuses a ${status} one byte longer, ${how}`, async () => {
          const total = MAX_ANSWER_BYTES + 1;
          const { answer } = streamed(status, declared ? { total, declared: total } : { total });
          fake.answer(answer);
          await assert.rejects(
            client.healthz(),
            (error) =>
              error instanceof AnswerTooLarge &&
              error.message === `the answer is longer than ${MAX_ANSWER_BYTES} bytes`,
          );
        });
      }
    }

    it("counts bytes, not characters", async () => {
      // 3 bytes a character: under the limit in characters, over it in bytes
      const build = "€".repeat(MAX_ANSWER_BYTES / 3);
      const raw = JSON.stringify({ ok: true, build, backupTransfer: "r2" });
      assert.ok(raw.length < MAX_ANSWER_BYTES && Buffer.byteLength(raw) > MAX_ANSWER_BYTES);
      fake.answer({ status: 200, body: null, raw });
      await assert.rejects(client.healthz(), AnswerTooLarge);
    });

    it("trusts a Content-Length over the limit without reading the body", async () => {
      // 10 bytes sent, more declared, the connection held open: reading would time out
      const { answer, closed } = streamed(200, { total: 10, declared: MAX_ANSWER_BYTES + 1 });
      fake.answer(answer);
      const patient = new SeedkeeperClient({
        baseUrl: fake.url,
        credentials: KEYS,
        requestTimeoutMs: 5000,
      });
      await assert.rejects(within(patient.healthz(), 2000), AnswerTooLarge);
      await within(closed, 2000);
    });

    it("stops reading an endless answer past the limit, and hangs up", async () => {
      const { answer, sent, closed } = streamed(200);
      fake.answer(answer);
      const patient = new SeedkeeperClient({
        baseUrl: fake.url,
        credentials: KEYS,
        requestTimeoutMs: 10_000,
      });
      await assert.rejects(within(patient.healthz(), 5000), AnswerTooLarge);
      await within(closed, 5000);
      assert.ok(sent.hungUp, "the client closed the connection");
      assert.ok(sent.bytes < 4 * MAX_ANSWER_BYTES, `${sent.bytes} bytes sent`);
    });

    it("refuses an endless refusal too, not as a SeedkeeperRefused", async () => {
      const { answer, closed } = streamed(503);
      fake.answer(answer);
      const error = await within(client.seed("slot-1", SEED, { claim: CLAIM }), 5000).catch(
        (e) => e,
      );
      assert.ok(error instanceof AnswerTooLarge, String(error));
      assert.ok(!(error instanceof SeedkeeperRefused));
      await within(closed, 5000);
    });
  });

  describe("URLs", () => {
    it("sends each route to its function's URL, healthz to the one it names", async () => {
      const urls = {
        seed: `${fake.url}/seed-fn/`,
        receipt: `${fake.url}/receipt-fn`,
        slot_evidence: `${fake.url}/evidence-fn`,
        rotation: `${fake.url}/rotation-fn`,
      };
      const routed = new SeedkeeperClient({ baseUrl: urls, credentials: KEYS });
      const paths = [];
      const calls = [
        () => routed.seed("slot-1", null),
        () => routed.keepalive("slot-1", null),
        () => routed.receipt("slot-1", { claim: CLAIM, seed: SEED, incarnation: INCARNATION }),
        () => routed.slotEvidence("slot-1", { claim: CLAIM }),
        () => routed.snapshotStatus("widgets"),
        () => routed.healthz(),
        () => routed.healthz("rotation"),
      ];
      for (const call of calls) {
        fake.answer({ status: 418, body: { error: "teapot" } });
        await assert.rejects(call(), { status: 418 });
        paths.push(fake.last.path);
      }
      assert.deepEqual(paths, [
        "/seed-fn/seed",
        "/seed-fn/keepalive",
        "/receipt-fn/receipt",
        "/evidence-fn/slot-evidence",
        "/rotation-fn/snapshots/widgets",
        "/seed-fn/healthz",
        "/rotation-fn/healthz",
      ]);
    });

    it("says which function has no URL, and which base is not an http(s) URL", async () => {
      const partial = new SeedkeeperClient({ baseUrl: { seed: fake.url }, credentials: KEYS });
      await assert.rejects(
        partial.publish(/** @type {any} */ ({})),
        /: no URL given for the rotation function$/,
      );
      await assert.rejects(
        partial.healthz(/** @type {any} */ ("constructor")),
        (error) =>
          error instanceof SeedkeeperError &&
          error.message === "no URL given for the constructor function",
      );
      assert.throws(
        () => new SeedkeeperClient({ baseUrl: "not a url", credentials: KEYS }),
        /the base URL \(baseUrl\) is not a URL/,
      );
      assert.throws(
        () => new SeedkeeperClient({ baseUrl: { seed: "ftp://x" }, credentials: KEYS }),
        /the seed URL \(baseUrl\.seed\) is not an http/,
      );
    });

    const schemes = [
      "file:///etc/passwd",
      "data:,{}",
      "ftp://127.0.0.1/x",
      "ws://127.0.0.1/x",
      "blob:https://secret.example/x",
      "javascript:alert(1)",
      "mailto:secret@example.com",
      "about:blank",
    ];
    for (const url of schemes) {
      const scheme = url.slice(0, url.indexOf(":") + 1);
      it(`refuses a ${scheme} base URL, naming the option, never the URL`, () => {
        /** @type {[import("seedkeeper-client").ClientOptions["baseUrl"], RegExp][]} */
        const options = [
          [url, /^the base URL \(baseUrl\) is not an http: or https: URL$/],
          [
            { seed: fake.url, rotation: url },
            /^the rotation URL \(baseUrl\.rotation\) is not an http: or https: URL$/,
          ],
        ];
        for (const [baseUrl, message] of options) {
          const error = (() => {
            try {
              new SeedkeeperClient({ baseUrl, credentials: KEYS });
            } catch (thrown) {
              return thrown;
            }
          })();
          assert.ok(error instanceof SeedkeeperError, `${scheme} is refused`);
          assert.match(error.message, message);
          assert.ok(!String(error.stack).includes(url), "the URL is not printed");
        }
      });
    }

    it("refuses a base URL with a user name or password, never printing it", () => {
      /** @type {[unknown, RegExp][]} */
      const cases = [
        [
          "http://user:pa55word@127.0.0.1:9",
          /^the base URL \(baseUrl\) has a user name or password$/,
        ],
        [
          { receipt: "https://pa55word@x.example" },
          /^the receipt URL \(baseUrl\.receipt\) has a user/,
        ],
      ];
      for (const [baseUrl, message] of cases) {
        assert.throws(
          () => new SeedkeeperClient({ baseUrl: /** @type {any} */ (baseUrl), credentials: KEYS }),
          (error) =>
            error instanceof SeedkeeperError &&
            message.test(error.message) &&
            !String(error.stack).includes("pa55word"),
        );
      }
    });

    it("refuses a base URL with a query or fragment, even an empty one", () => {
      /** @type {[unknown, string][]} */
      const cases = [
        ["http://127.0.0.1:9/?", "the base URL (baseUrl)"],
        ["http://127.0.0.1:9/#", "the base URL (baseUrl)"],
        ["https://x.example/?a=1", "the base URL (baseUrl)"],
        [{ seed: "https://x.example/#top" }, "the seed URL (baseUrl.seed)"],
      ];
      for (const [baseUrl, what] of cases) {
        assert.throws(
          () => new SeedkeeperClient({ baseUrl: /** @type {any} */ (baseUrl), credentials: KEYS }),
          (error) =>
            error instanceof SeedkeeperError &&
            error.message === `${what} has a query or a fragment` &&
            !String(error.stack).includes("example") &&
            !String(error.stack).includes("127.0.0.1"),
          JSON.stringify(baseUrl),
        );
      }
    });

    it("names a baseUrl entry that is not a function's without printing its key", () => {
      assert.throws(
        () =>
          new SeedkeeperClient({
            baseUrl: /** @type {any} */ ({ "https://secret.example": "file:///x" }),
            credentials: KEYS,
          }),
        (error) =>
          error instanceof SeedkeeperError &&
          /^a baseUrl entry is not an http: or https: URL$/.test(error.message),
      );
    });

    it("accepts http: and https: base URLs, whatever their case", () => {
      for (const baseUrl of ["https://abc.lambda-url.us-east-1.on.aws/", "HTTP://127.0.0.1:8787"]) {
        assert.ok(new SeedkeeperClient({ baseUrl, credentials: KEYS }));
      }
    });

    it("is Unreachable when the answer's body does not end in time", async () => {
      // 10 bytes of the 20 declared sent, the connection held open
      const { answer, closed } = streamed(200, { total: 10, declared: 20 });
      fake.answer(answer);
      const slow = new SeedkeeperClient({
        baseUrl: fake.url,
        credentials: KEYS,
        requestTimeoutMs: 100,
      });
      await assert.rejects(
        within(slow.healthz(), 2000),
        (error) => error instanceof Unreachable && error.message === "no answer: TimeoutError",
      );
      await within(closed, 2000);
    });

    it("is Unreachable when nothing answers in time", async () => {
      const silent = createServer(() => {});
      await new Promise((resolve) => silent.listen(0, "127.0.0.1", () => resolve(null)));
      const address = /** @type {import("node:net").AddressInfo} */ (silent.address());
      const slow = new SeedkeeperClient({
        baseUrl: `http://127.0.0.1:${address.port}`,
        credentials: KEYS,
        requestTimeoutMs: 50,
      });
      await assert.rejects(
        slow.healthz(),
        (error) => error instanceof Unreachable && error.message === "no answer: TimeoutError",
      );
      silent.closeAllConnections();
      await new Promise((resolve) => silent.close(() => resolve(null)));
    });
  });
});

/** What a module imports: from a static import or re-export, for its side effects, or
 * dynamically. @param {string} source */
function importsOf(source) {
  return [...source.matchAll(/\b(?:from|import)\s*\(?\s*["']([^"']+)["']/g)].map((m) => m[1]);
}

describe("the built library", () => {
  it("finds every kind of import", () => {
    const source = [
      'import a from "a";',
      "import { b } from 'b';",
      'export * from "./c.js";',
      'import "d";',
      'const e = await import("e");',
      "import * as f from 'node:f';",
    ].join("\n");
    assert.deepEqual(importsOf(source), ["a", "b", "./c.js", "d", "e", "node:f"]);
  });

  it("imports nothing but aws4fetch and itself (no Node-only module)", () => {
    const dist = new URL("../dist/", import.meta.url);
    for (const name of readdirSync(dist).filter((file) => file.endsWith(".js"))) {
      const source = readFileSync(new URL(name, dist), "utf8");
      for (const specifier of importsOf(source)) {
        assert.ok(
          specifier === "aws4fetch" || specifier?.startsWith("./"),
          `${name} imports ${specifier}`,
        );
      }
      assert.doesNotMatch(source, /\brequire\s*\(|\bprocess\.|\bBuffer\b|["']node:/, name);
    }
  });
});
