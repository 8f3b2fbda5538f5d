/**
 * Checking an answer's shape at run time, field by field, as the Python client's models
 * do: a wrong type, a missing field or a value outside a literal throws `BadAnswer`
 * naming the field (never the value). Numbers the models hold as `int` must be integers.
 * A field the client does not know is left out of what it returns, not refused (a newer
 * deployment may add one), except in a claim, which must be exactly the one asked with.
 */

import { BadAnswer } from "./errors.js";

export type Check<T> = (value: unknown, at: string) => T;

function fail(at: string, wanted: string): never {
  throw new BadAnswer(`the answer's ${at} is not ${wanted}`);
}

export const str: Check<string> = (value, at) =>
  typeof value === "string" ? value : fail(at, "a string");

export const int: Check<number> = (value, at) =>
  typeof value === "number" && Number.isInteger(value) ? value : fail(at, "an integer");

export const bool: Check<boolean> = (value, at) =>
  typeof value === "boolean" ? value : fail(at, "a boolean");

export function literal<const L extends string | boolean>(...allowed: L[]): Check<L> {
  return (value, at) =>
    allowed.includes(value as L) ? (value as L) : fail(at, `one of ${allowed.join(", ")}`);
}

export function nullable<T>(check: Check<T>): Check<T | null> {
  return (value, at) => (value === null ? null : check(value, at));
}

/** A field the model gives a default: absent means `fallback`. */
export function withDefault<T>(check: Check<T>, fallback: T): Check<T> & { optional: true } {
  const checked = (value: unknown, at: string): T =>
    value === undefined ? fallback : check(value, at);
  return Object.assign(checked, { optional: true as const });
}

export function list<T>(check: Check<T>): Check<T[]> {
  return (value, at) =>
    Array.isArray(value)
      ? value.map((item, index) => check(item, `${at}[${index}]`))
      : fail(at, "a list");
}

export function record<T>(check: Check<T>): Check<Record<string, T>> {
  return (value, at) => {
    const found = plainObject(value, at);
    const out: Record<string, T> = {};
    for (const [key, item] of Object.entries(found)) out[key] = check(item, `${at}.${key}`);
    return out;
  };
}

export function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function plainObject(value: unknown, at: string): Record<string, unknown> {
  return isPlainObject(value) ? value : fail(at, "an object");
}

type Fields = Record<string, Check<unknown>>;
type Parsed<F extends Fields> = { [K in keyof F]: F[K] extends Check<infer T> ? T : never };

/** An object of these fields only (each required unless it has a default); with `exact`,
 * any other field is refused, else left out. Its `fields` say them (to hold them to the
 * server's models). Own fields only: a `toString` or `__proto__` is a field like another. */
export function object<F extends Fields>(
  fields: F,
  exact = false,
): Check<Parsed<F>> & { fields: F } {
  const check = (value: unknown, at: string): Parsed<F> => {
    const found = plainObject(value, at);
    const out: Record<string, unknown> = {};
    for (const [name, field] of Object.entries(fields)) {
      if (!Object.hasOwn(found, name) && !Object.hasOwn(field, "optional")) {
        fail(`${at}.${name}`, "there");
      }
      out[name] = field(found[name], `${at}.${name}`);
    }
    if (exact) {
      const extra = Object.keys(found).find((name) => !Object.hasOwn(fields, name));
      if (extra !== undefined) fail(at, `free of other fields (${JSON.stringify(extra)})`);
    }
    return out as Parsed<F>;
  };
  return Object.assign(check, { fields });
}
