/**
 * What the client sends and what the functions answer, as the Python models
 * (`seedkeeper.domain.models`, `.snapshots`, `.outcomes`) name them. A field the model
 * gives a default is always there in an answer: the client fills it in.
 */

// -- requests ------------------------------------------------------------------------------

/** Who a slot's work belongs to, from the executor's trusted run context only. */
export interface OwnerClaim {
  run: string;
  requester: string;
  thread: string;
  repository: string;
  ref: string;
  head: string;
}

/** Which snapshot a slot is seeded from: a seed handle (`SnapshotStatus.seed_handle`) with
 * its resource, optionally followed by a fetch. */
export interface SeedIdentity {
  resource: string;
  ref: string;
  sha: string;
  checkout_backup_id: string;
  deps_backup_id?: string | null;
  fetch_ref?: string | null;
  fetch_sha?: string | null;
}

/** One squashfs archive in R2, as its publisher measured it. */
export interface Archive {
  backup_id: string;
  size: number;
  sha256: string;
}

/** What a resident publishes (`POST /snapshots`). `deps` and `lockfile_hash` go together. */
export interface NewSnapshot {
  resource: string;
  ref: string;
  sha: string;
  created_at: number;
  checkout: Archive;
  deps?: Archive | null;
  lockfile_hash?: string | null;
}

export interface SeedOptions {
  claim?: OwnerClaim | null;
  /** A credential-free `https://` Git URL. */
  origin?: string | null;
  /** Poll until the answer is no longer `seeding`. */
  wait?: boolean;
  /** How long `wait` polls before it throws `SeedTimeout` (default 300 000). */
  timeoutMs?: number;
  /** Between two polls (default 500). */
  intervalMs?: number;
}

export interface ReceiptRequest {
  claim: OwnerClaim;
  seed: SeedIdentity;
  /** The birth container the seed answer gave. */
  incarnation: string;
}

export interface EvidenceRequest {
  claim: OwnerClaim;
}

/** The functions of a deployment, each with its own URL. */
export type FunctionName = "seed" | "receipt" | "slot_evidence" | "rotation";

// -- POST /seed ------------------------------------------------------------------------------

/** 202: born, or still restoring: poll again. */
export interface Seeding {
  state: "seeding";
  seeded?: undefined;
  slot: string;
  attempt: number;
  incarnation: string | null;
  claim: OwnerClaim | null;
  /** Restoring the slot's parked checkpoint. */
  resumed: boolean;
}

/** Restored, verified and checked out (`sha` is the HEAD it ended at). */
export interface Seeded {
  seeded: true;
  state?: undefined;
  cached: boolean;
  ref: string;
  sha: string;
  /** "checkpoint" when resumed from the slot's own checkpoint. */
  from: string;
  steps: Record<string, number>;
  ms: number;
  incarnation: string | null;
  claim: OwnerClaim | null;
  /** The sandbox was stopped for a checkpoint and this poll asked for it back: poll
   * again until false. */
  frozen: boolean;
  resumed: boolean;
}

/** The slot runs cold: `reason` is `seed-failed`, `seed-missing`, `unsafe-archive`,
 * `seed-unconfigured` or `lost` (to the owner only). */
export interface NotSeeded {
  seeded: false;
  state?: undefined;
  reason: string;
  step: string | null;
  detail: string | null;
}

/** A cold slot (`seed` null), launched without a restore. */
export interface Cold {
  state: "unseeded";
  seeded: false;
  slot: string;
  attempt: number;
  incarnation: string | null;
  claim: OwnerClaim | null;
}

/** Tell them apart by `state` ("seeding", "unseeded") and then `seeded` (true, false), or
 * with `isSeeding`, `isCold`, `isSeeded`, `isNotSeeded`. */
export type SeedAnswer = Seeded | NotSeeded | Cold | Seeding;

// -- POST /keepalive -----------------------------------------------------------------------

export interface KeptAlive {
  slot: string;
  claim: OwnerClaim | null;
  state: string;
  idle_deadline: number;
  frozen: boolean;
}

// -- POST /receipt, POST /slot-evidence ----------------------------------------------------

export type CheckpointState = "present" | "lost" | "unknown";

export interface Receipt {
  slot: string;
  checkpoint: CheckpointState;
  /** For "unknown" (and a lost slot): what made it so. */
  why: string | null;
  size: number | null;
  sha256: string | null;
  created_at: number | null;
  expires_at: number | null;
  parked: boolean;
  retention_expires_at: number | null;
}

/** Never a stop permit. */
export interface Evidence {
  slot: string;
  incarnation: string | null;
  state: string;
  checkpoint: CheckpointState;
  disposition: "retained" | "retired" | "parked" | "lost";
}

// -- /snapshots ------------------------------------------------------------------------------

export interface Snapshot {
  resource: string;
  ref: string;
  sha: string;
  created_at: number;
  checkout: Archive;
  deps: Archive | null;
  lockfile_hash: string | null;
  generation: number;
}

/** What one attempt to pay the deletion ledger did. */
export interface Payment {
  deleted: string[];
  pending: string[];
  spared: string[];
}

export interface Recorded {
  resource: string;
  rotated: boolean;
  current: Snapshot;
  retired: Snapshot | null;
  payment: Payment;
}

export interface SeedHandle {
  ref: string;
  sha: string;
  checkout_backup_id: string;
  deps_backup_id: string | null;
}

export interface DepsEntry {
  lockfile_hash: string;
  archive: Archive;
  generation: number;
}

export interface ObjectCounts {
  recorded: number;
  /** null when R2 is not configured or did not answer. */
  present: number | null;
}

export interface SnapshotStatus {
  resource: string;
  current: Snapshot | null;
  retired: Snapshot | null;
  seed_handle: SeedHandle | null;
  deps: DepsEntry[];
  pending_deletions: string[];
  objects: ObjectCounts;
}

export interface Health {
  ok: boolean;
  build: string;
  backupTransfer: string;
}
