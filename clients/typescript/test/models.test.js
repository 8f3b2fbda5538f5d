// @ts-check
// The answer checks against the server's models: the same models, each with the server's
// fields, required where the server requires them. SEEDKEEPER_SERVER_FIELDS names a JSON
// file of {model: {field: required}}, which tests/e2e/test_typescript_client.py writes from
// the server's models; skipped without it.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { it } from "node:test";

import { MODELS } from "../dist/answers.js";

const SERVER_FIELDS = process.env["SEEDKEEPER_SERVER_FIELDS"];

it(
  "checks each answer with the fields of the server's model",
  { skip: SERVER_FIELDS ? false : "SEEDKEEPER_SERVER_FIELDS is not set" },
  () => {
    const server = JSON.parse(readFileSync(/** @type {string} */ (SERVER_FIELDS), "utf8"));
    const checked = Object.fromEntries(
      Object.entries(MODELS).map(([model, check]) => [
        model,
        Object.fromEntries(
          Object.entries(check.fields).map(([field, fieldCheck]) => [
            field,
            !Object.hasOwn(fieldCheck, "optional"),
          ]),
        ),
      ]),
    );
    assert.deepEqual(checked, server);
  },
);
