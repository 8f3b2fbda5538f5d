// @ts-check
// The client against a fake function URL (node:http): every claim check, the refusal
// mapping, the routes and bodies, and a SigV4 signature checked by a verifier of its own
// (node:crypto, not aws4fetch). Nothing here reaches the network beyond 127.0.0.1.

import assert from "node:assert/strict";
import { createHash, createHmac } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { createServer } from "node:http";
import { after, before, beforeEach, describe, it } from "node:test";

import {
  BadAnswer,
  ClaimNotEchoed,
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
 * @typedef {{status: number, body: unknown, raw?: string, type?: string}} Answer
 */

/** A fake function URL: answers from a queue (the last one repeats), records each request. */
class FakeUrl {
  /** @type {Seen[]} */ seen = [];
  /** @type {Answer[]} */ answers = [];
  server = createServer((request, response) => {
    /** @type {Buffer[]} */
    const chunks = [];
    request.on("data", (chunk) => chunks.push(chunk));
    request.on("end", () => {
      this.seen.push({
        method: request.method ?? "",
        path: request.url ?? "",
        rawHeaders: request.rawHeaders,
        body: Buffer.concat(chunks).toString("utf8"),
      });
      const answer = this.answers.length > 1 ? this.answers.shift() : this.answers[0];
      if (answer === undefined) throw new Error("no answer queued");
      const text = answer.raw ?? JSON.stringify(answer.body);
      response.writeHead(answer.status, { "Content-Type": answer.type ?? "application/json" });
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

// -- an independent SigV4 verifier (service lambda) --------------------------------------------

/** @param {string} s */
const rfc3986 = (s) =>
  encodeURIComponent(s).replace(
    /[!'()*]/g,
    (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`,
  );

/**
 * Recompute the signature of a request as AWS does for a non-S3 service (each path segment
 * encoded once more, the signed headers as they arrived, the body's sha256) and compare.
 * @param {Seen} seen
 * @param {{secretAccessKey: string, region?: string, service?: string}} expected
 */
function verifySigV4(seen, { secretAccessKey, region = "us-east-1", service = "lambda" }) {
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
  assert.equal(scopeService, service);
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
  return { keyId, headers };
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
  beforeEach(() => fake.answer({ status: 500, body: { error: "nothing-queued" } }));

  describe("signing", () => {
    it("signs a POST with SigV4 for service lambda in us-east-1, the body included", async () => {
      fake.answer({ status: 202, body: seeding("slot-1") });
      await client.seed("slot-1", SEED, { claim: CLAIM, origin: "https://git.example.com/a.git" });
      const { keyId, headers } = verifySigV4(fake.last, KEYS);
      assert.equal(keyId, KEYS.accessKeyId);
      assert.equal(headers.get("content-type")?.[0], "application/json");
      assert.equal(headers.has("x-amz-security-token"), false);
    });

    it("signs a GET without a body, an escaped path segment included", async () => {
      fake.answer({ status: 404, body: { error: "not-found" } });
      await assert.rejects(client.snapshotStatus("a b/c"), SeedkeeperRefused);
      assert.equal(fake.last.method, "GET");
      assert.equal(fake.last.path, "/snapshots/a%20b%2Fc");
      verifySigV4(fake.last, KEYS);
    });

    it("signs for the region it is given, with the session token of temporary keys", async () => {
      const temporary = { ...KEYS, sessionToken: "session-token-1" };
      const other = new SeedkeeperClient({
        baseUrl: fake.url,
        credentials: async () => temporary,
        region: "eu-west-1",
      });
      fake.answer({ status: 200, body: keptAlive("slot-1", { claim: null }) });
      await other.keepalive("slot-1", null);
      const { headers } = verifySigV4(fake.last, { ...temporary, region: "eu-west-1" });
      assert.equal(headers.get("x-amz-security-token")?.[0], "session-token-1");
      const authorization = headers.get("authorization")?.[0] ?? "";
      assert.ok(
        /SignedHeaders=[^,]*x-amz-security-token/.test(authorization),
        "the token is signed",
      );
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

    it("maps a refusal that is not JSON to its text", async () => {
      fake.answer({ status: 502, body: null, raw: "Bad Gateway", type: "text/plain" });
      const error = await client.healthz().catch((e) => e);
      assert.ok(error instanceof SeedkeeperRefused);
      assert.deepEqual(
        [error.status, error.reason, error.body],
        [502, "Bad Gateway", { error: "Bad Gateway" }],
      );
    });

    it("maps a refusal whose JSON is not an object", async () => {
      fake.answer({ status: 500, body: ["x"] });
      const error = await client.healthz().catch((e) => e);
      assert.ok(error instanceof SeedkeeperRefused);
      assert.deepEqual([error.reason, error.body], ['["x"]', { error: '["x"]' }]);
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

    it("does not follow a redirect with its signature", async () => {
      fake.answer({ status: 307, body: {} });
      await assert.rejects(client.healthz(), /redirect \(307\)/);
      assert.equal(fake.seen.length, 1);
    });

    it("never names the URL, a key or the signature in an error", async () => {
      const errors = [];
      for (const answer of [
        { status: 403, body: { message: "Forbidden" } },
        { status: 200, body: null, raw: "nope" },
        { status: 200, body: seeded({ claim: null }) },
        { status: 200, body: { ok: "yes" } },
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
        verifySigV4(fake.last, KEYS);
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

    it("says which function has no URL, and refuses a base that is not an http(s) URL", async () => {
      const partial = new SeedkeeperClient({ baseUrl: { seed: fake.url }, credentials: KEYS });
      await assert.rejects(
        partial.publish(/** @type {any} */ ({})),
        /no URL for the rotation function/,
      );
      assert.throws(
        () => new SeedkeeperClient({ baseUrl: "not a url", credentials: KEYS }),
        /is not a URL/,
      );
      assert.throws(
        () => new SeedkeeperClient({ baseUrl: { seed: "ftp://x" }, credentials: KEYS }),
        /seed URL is not an http/,
      );
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

describe("the built library", () => {
  it("imports nothing but aws4fetch and itself (no Node-only module)", () => {
    const dist = new URL("../dist/", import.meta.url);
    for (const name of readdirSync(dist).filter((file) => file.endsWith(".js"))) {
      const source = readFileSync(new URL(name, dist), "utf8");
      const imported = [...source.matchAll(/(?:import|export)[^'"]*from\s*["']([^"']+)["']/g)].map(
        (m) => m[1],
      );
      for (const specifier of imported) {
        assert.ok(
          specifier === "aws4fetch" || specifier?.startsWith("./"),
          `${name} imports ${specifier}`,
        );
      }
      assert.doesNotMatch(source, /\brequire\s*\(|\bprocess\.|\bBuffer\b|["']node:/, name);
    }
  });
});
