/**
 * Each route's answer checked against its model, and the two echo checks: a slot answer
 * (cold, seeding, seeded) must echo the claim asked with, with an incarnation when there
 * is one, and a cold or seeding one must name the slot asked about; a keepalive answer must
 * echo the slot and the claim. A claimed slot is never taken for cold, nor one slot for
 * another.
 */

import { BadAnswer, ClaimNotEchoed } from "./errors.js";
import {
  bool,
  type Check,
  int,
  isPlainObject,
  list,
  literal,
  nullable,
  object,
  record,
  str,
  withDefault,
} from "./shape.js";
import type {
  Archive,
  Cold,
  DepsEntry,
  Evidence,
  Health,
  KeptAlive,
  NotSeeded,
  ObjectCounts,
  OwnerClaim,
  Payment,
  Receipt,
  Recorded,
  SeedAnswer,
  Seeded,
  SeedHandle,
  Seeding,
  Snapshot,
  SnapshotStatus,
} from "./types.js";

/** Exactly the six fields of a claim: an echo with another field is not this claim. */
const claim = object(
  { run: str, requester: str, thread: str, repository: str, ref: str, head: str },
  true,
) satisfies Check<OwnerClaim>;

export const CLAIM_FIELDS = Object.keys(claim.fields) as readonly (keyof OwnerClaim)[];

const archive = object({ backup_id: str, size: int, sha256: str }) satisfies Check<Archive>;

const snapshot = object({
  resource: str,
  ref: str,
  sha: str,
  created_at: int,
  checkout: archive,
  deps: withDefault(nullable(archive), null),
  lockfile_hash: withDefault(nullable(str), null),
  generation: int,
}) satisfies Check<Snapshot>;

// Each discriminator (state, seeded) has its server model's default, as Python's does: only
// a Seeding's state may be absent, seedAnswer reaching the other checks by theirs.
const seeding = object({
  state: withDefault(literal("seeding"), "seeding"),
  slot: str,
  attempt: int,
  incarnation: nullable(str),
  claim: nullable(claim),
  resumed: withDefault(bool, false),
}) satisfies Check<Seeding>;

const seeded = object({
  seeded: withDefault(literal(true), true),
  cached: bool,
  ref: str,
  sha: str,
  from: str,
  steps: record(int),
  ms: int,
  incarnation: nullable(str),
  claim: nullable(claim),
  frozen: withDefault(bool, false),
  resumed: withDefault(bool, false),
}) satisfies Check<Seeded>;

const notSeeded = object({
  seeded: withDefault(literal(false), false),
  reason: str,
  step: withDefault(nullable(str), null),
  detail: withDefault(nullable(str), null),
}) satisfies Check<NotSeeded>;

const cold = object({
  state: withDefault(literal("unseeded"), "unseeded"),
  seeded: withDefault(literal(false), false),
  slot: str,
  attempt: int,
  incarnation: nullable(str),
  claim: withDefault(nullable(claim), null),
}) satisfies Check<Cold>;

const keptAliveShape = object({
  slot: str,
  claim: nullable(claim),
  state: str,
  idle_deadline: int,
  frozen: bool,
}) satisfies Check<KeptAlive>;

const checkpointState = literal("present", "lost", "unknown");

export const receipt = object({
  slot: str,
  checkpoint: checkpointState,
  why: withDefault(nullable(str), null),
  size: withDefault(nullable(int), null),
  sha256: withDefault(nullable(str), null),
  created_at: withDefault(nullable(int), null),
  expires_at: withDefault(nullable(int), null),
  parked: withDefault(bool, false),
  retention_expires_at: withDefault(nullable(int), null),
}) satisfies Check<Receipt>;

export const evidence = object({
  slot: str,
  incarnation: nullable(str),
  state: str,
  checkpoint: checkpointState,
  disposition: literal("retained", "retired", "parked", "lost"),
}) satisfies Check<Evidence>;

export const payment = object({
  deleted: withDefault(list(str), []),
  pending: withDefault(list(str), []),
  spared: withDefault(list(str), []),
}) satisfies Check<Payment>;

export const recorded = object({
  resource: str,
  rotated: bool,
  current: snapshot,
  retired: nullable(snapshot),
  payment,
}) satisfies Check<Recorded>;

const seedHandle = object({
  ref: str,
  sha: str,
  checkout_backup_id: str,
  deps_backup_id: nullable(str),
}) satisfies Check<SeedHandle>;

const depsEntry = object({
  lockfile_hash: str,
  archive,
  generation: int,
}) satisfies Check<DepsEntry>;

const objectCounts = object({
  recorded: int,
  present: nullable(int),
}) satisfies Check<ObjectCounts>;

export const snapshotStatus = object({
  resource: str,
  current: nullable(snapshot),
  retired: nullable(snapshot),
  seed_handle: nullable(seedHandle),
  deps: list(depsEntry),
  pending_deletions: list(str),
  objects: objectCounts,
}) satisfies Check<SnapshotStatus>;

export const health = object({
  ok: bool,
  build: str,
  backupTransfer: str,
}) satisfies Check<Health>;

/** Each answer's check by the name of the server's model of it: the e2e tests hold their
 * fields to the server's (tests/e2e/test_typescript_client.py). */
export const MODELS = {
  OwnerClaim: claim,
  Archive: archive,
  Snapshot: snapshot,
  Seeding: seeding,
  Seeded: seeded,
  NotSeeded: notSeeded,
  Cold: cold,
  KeptAlive: keptAliveShape,
  Receipt: receipt,
  Evidence: evidence,
  Payment: payment,
  Recorded: recorded,
  SeedHandle: seedHandle,
  DepsEntry: depsEntry,
  ObjectCounts: objectCounts,
  SnapshotStatus: snapshotStatus,
  Health: health,
};

/** The same claim, field by field (both absent counts as the same). */
export function sameClaim(echoed: OwnerClaim | null, asked: OwnerClaim | null): boolean {
  if (echoed === null || asked === null) return echoed === asked;
  return CLAIM_FIELDS.every((field) => echoed[field] === asked[field]);
}

/** A slot answer, told apart as the Python client's `_seed_answer` does: `seeded` false
 * without the cold state is a NotSeeded (returned as it is); the cold state a Cold; a
 * true `seeded` a Seeded; anything else a Seeding. */
export function seedAnswer(answer: unknown, asked: OwnerClaim | null, slot: string): SeedAnswer {
  if (!isPlainObject(answer)) throw new BadAnswer("the seed answer is not a JSON object");
  if (answer["seeded"] === false && answer["state"] !== "unseeded") {
    return notSeeded(answer, "body");
  }
  const parsed: Seeded | Cold | Seeding =
    answer["state"] === "unseeded"
      ? cold(answer, "body")
      : answer["seeded"]
        ? seeded(answer, "body")
        : seeding(answer, "body");
  if (parsed.state !== undefined && parsed.slot !== slot) {
    throw new ClaimNotEchoed("the seed answer is about another slot");
  }
  if (!sameClaim(parsed.claim, asked) || (asked !== null && !parsed.incarnation)) {
    throw new ClaimNotEchoed("the seed answer does not echo this claim with an incarnation");
  }
  return parsed;
}

/** An answer about another slot, or that does not echo the claim, proves nothing about
 * this one. */
export function keptAlive(answer: unknown, slot: string, asked: OwnerClaim | null): KeptAlive {
  const parsed = keptAliveShape(answer, "body");
  if (parsed.slot !== slot || !sameClaim(parsed.claim, asked)) {
    throw new ClaimNotEchoed("the keepalive answer does not echo this slot and claim");
  }
  return parsed;
}

export function isSeeding(answer: SeedAnswer): answer is Seeding {
  return answer.state === "seeding";
}

export function isCold(answer: SeedAnswer): answer is Cold {
  return answer.state === "unseeded";
}

export function isSeeded(answer: SeedAnswer): answer is Seeded {
  return answer.seeded === true;
}

export function isNotSeeded(answer: SeedAnswer): answer is NotSeeded {
  return answer.seeded === false && answer.state === undefined;
}
