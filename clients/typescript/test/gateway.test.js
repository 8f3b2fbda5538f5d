// @ts-check
// The client against a real Seedkeeper (the local stack's function-URL gateway, or a
// deployment): SEEDKEEPER_URL, SEEDKEEPER_ACCESS_KEY_ID, SEEDKEEPER_SECRET_ACCESS_KEY, and
// optionally SEEDKEEPER_REGION and SEEDKEEPER_SEED_JSON (a published seed identity: the
// claimed seed, keepalive, receipt, evidence and status). Skipped without SEEDKEEPER_URL.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { describe, it } from "node:test";

import { SeedkeeperClient, SeedkeeperRefused, isCold, isSeeded } from "seedkeeper-client";

const URL_ = process.env["SEEDKEEPER_URL"];
const SEED_JSON = process.env["SEEDKEEPER_SEED_JSON"];
const ORIGIN = "https://git.example.com/acme/widgets.git";

/** A name no earlier run against the same stack has used. */
const fresh = (/** @type {string} */ prefix) => `${prefix}-${randomBytes(4).toString("hex")}`;

/** @param {string} [secret] */
function clientWith(secret) {
  const accessKeyId = process.env["SEEDKEEPER_ACCESS_KEY_ID"];
  const secretAccessKey = secret ?? process.env["SEEDKEEPER_SECRET_ACCESS_KEY"];
  assert.ok(
    accessKeyId && secretAccessKey,
    "SEEDKEEPER_ACCESS_KEY_ID and SEEDKEEPER_SECRET_ACCESS_KEY",
  );
  return new SeedkeeperClient({
    baseUrl: /** @type {string} */ (URL_),
    credentials: { accessKeyId, secretAccessKey },
    region: process.env["SEEDKEEPER_REGION"] ?? "us-east-1",
  });
}

// Each test skips on its own (a skipped suite is not counted as skipped by node 20).
const noGateway = URL_ ? false : "SEEDKEEPER_URL is not set";
const noSeed = noGateway || (SEED_JSON ? false : "SEEDKEEPER_SEED_JSON is not set");

describe("against the gateway", () => {
  it("answers healthz", { skip: noGateway }, async () => {
    const health = await clientWith().healthz();
    assert.equal(health.ok, true);
  });

  it("refuses a request signed with a bad secret (403)", { skip: noGateway }, async () => {
    const error = await clientWith("not-the-secret")
      .healthz()
      .catch((e) => e);
    assert.ok(error instanceof SeedkeeperRefused, String(error));
    assert.equal(error.status, 403);
  });

  it("refuses a body with a bad field, naming the field", { skip: noGateway }, async () => {
    const error = await clientWith()
      .seed("no/slashes in a slot", null)
      .catch((e) => e);
    assert.ok(error instanceof SeedkeeperRefused, String(error));
    assert.ok(error.status >= 400 && error.status < 500, String(error.status));
    assert.equal(error.reason, "invalid-request");
    const fields = /** @type {{fields: {field: string}[]}} */ (error.body).fields.map(
      (f) => f.field,
    );
    assert.ok(
      fields.some((field) => /(^|\.)slot$/.test(field)),
      JSON.stringify(fields),
    );
  });

  it("seeds a cold slot", { skip: noGateway }, async () => {
    const slot = fresh("ts-cold");
    const answer = await clientWith().seed(slot, null, { wait: true, timeoutMs: 60_000 });
    assert.ok(isCold(answer), JSON.stringify(answer));
    assert.equal(answer.slot, slot);
    assert.equal(answer.claim, null);
    const kept = await clientWith().keepalive(slot, null);
    assert.equal(kept.slot, slot);
  });

  describe("with a published seed", () => {
    /** @type {import("seedkeeper-client").SeedIdentity} */
    const seed = JSON.parse(SEED_JSON ?? "{}");
    const slot = process.env["SEEDKEEPER_SLOT"] ?? fresh("ts-slot");
    /** @type {import("seedkeeper-client").OwnerClaim} */
    const claim = process.env["SEEDKEEPER_CLAIM_JSON"]
      ? JSON.parse(process.env["SEEDKEEPER_CLAIM_JSON"])
      : {
          run: fresh("run"),
          requester: "alice",
          thread: "thread-1",
          repository: "acme/widgets",
          ref: seed.ref,
          head: seed.sha,
        };
    /** @type {string} */
    let incarnation = "";

    it("seeds a claimed slot, waiting until it is seeded", { skip: noSeed }, async () => {
      const answer = await clientWith().seed(slot, seed, {
        claim,
        origin: ORIGIN,
        wait: true,
        timeoutMs: 120_000,
      });
      assert.ok(isSeeded(answer), JSON.stringify(answer));
      assert.deepEqual(answer.claim, claim);
      assert.equal(answer.sha, seed.sha);
      assert.ok(answer.incarnation);
      incarnation = answer.incarnation;
    });

    it("keeps it alive, echoing the slot and the claim", { skip: noSeed }, async () => {
      const kept = await clientWith().keepalive(slot, claim);
      assert.equal(kept.slot, slot);
      assert.deepEqual(kept.claim, claim);
      assert.ok(kept.idle_deadline > Date.now() / 1000);
    });

    it("answers a receipt and slot evidence", { skip: noSeed }, async () => {
      assert.ok(incarnation, "the slot was seeded");
      const receipt = await clientWith().receipt(slot, { claim, seed, incarnation });
      assert.equal(receipt.slot, slot);
      assert.deepEqual([receipt.checkpoint, receipt.why], ["unknown", "no-checkpoint"]);
      const evidence = await clientWith().slotEvidence(slot, { claim });
      assert.deepEqual(
        [evidence.slot, evidence.incarnation, evidence.disposition],
        [slot, incarnation, "retained"],
      );
    });

    it("refuses another owner's claim on the slot (409)", { skip: noSeed }, async () => {
      const other = { ...claim, requester: "mallory" };
      await assert.rejects(clientWith().seed(slot, seed, { claim: other, origin: ORIGIN }), {
        status: 409,
        reason: "claim-mismatch",
      });
    });

    it("reads the resource's snapshot status", { skip: noSeed }, async () => {
      const status = await clientWith().snapshotStatus(seed.resource);
      assert.equal(status.resource, seed.resource);
      assert.equal(status.seed_handle?.sha, seed.sha);
      assert.equal(status.seed_handle?.checkout_backup_id, seed.checkout_backup_id);
      assert.ok((status.current?.generation ?? 0) >= 1);
    });
  });
});
