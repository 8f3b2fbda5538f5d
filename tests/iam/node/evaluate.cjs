#!/usr/bin/env node
// The suite's IAM evaluator: AWS's policy evaluation, conditions included, by
// @cloud-copilot/iam-simulate (AGPL-3.0: a dev-only tool, in a process of its own).
//
// A line protocol on stdin and stdout, one JSON object a line:
//   first line in:  {"principals": {"<id>": {"arn": "...", "policies": [{"name", "policy"}]}}}
//   then each line: {"id", "principal", "action", "resource", "context": {key: value or list}}
//   each line out:  {"id", "result": "Allowed"|"ImplicitlyDenied"|"ExplicitlyDenied"|"Error",
//                    "ignored": [context keys the action does not take], "error"?: ...}
'use strict'

const readline = require('readline')
const { runSimulation } = require('@cloud-copilot/iam-simulate')
const { createValidatedPolicy, validateIdentityPolicy } = require('@cloud-copilot/iam-policy')

// Every context value as a string (iam-simulate compares strings: a JSON true fails Bool).
function context(values) {
  const out = {}
  for (const [key, value] of Object.entries(values || {})) {
    out[key] = Array.isArray(value) ? value.map(String) : String(value)
  }
  return out
}

// The resource's account decides same- or cross-account evaluation, and iam-simulate takes
// it from the request, never from the ARN: the ARN's own account field.
function accountOf(arn, principalArn) {
  const parts = String(arn).split(':')
  return /^\d{12}$/.test(parts[4] || '') ? parts[4] : String(principalArn).split(':')[4]
}

async function main() {
  const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity })
  let principals = null
  for await (const line of lines) {
    if (!line.trim()) continue
    const message = JSON.parse(line)
    if (principals === null) {
      principals = {}
      const invalid = {}
      for (const [id, principal] of Object.entries(message.principals)) {
        principals[id] = {
          arn: principal.arn,
          policies: principal.policies.map(({ name, policy }) => {
            const validated = createValidatedPolicy(policy, validateIdentityPolicy, { name })
            if (validated.errors.length) (invalid[id] ||= {})[name] = validated.errors
            return { name, policy: validated }
          })
        }
      }
      process.stdout.write(JSON.stringify({ ready: true, invalid }) + '\n')
      continue
    }
    process.stdout.write(JSON.stringify(await evaluate(principals, message)) + '\n')
  }
}

async function evaluate(principals, request) {
  const principal = principals[request.principal]
  if (!principal) return { id: request.id, result: 'Error', error: `no principal ${request.principal}` }
  const simulation = {
    request: {
      principal: principal.arn,
      action: request.action,
      resource: { resource: request.resource, accountId: accountOf(request.resource, principal.arn) },
      contextVariables: context(request.context)
    },
    identityPolicies: principal.policies,
    serviceControlPolicies: [],
    resourceControlPolicies: []
  }
  try {
    const simulated = await runSimulation(simulation, { simulationMode: 'Strict' })
    if (simulated.resultType === 'error') return { id: request.id, result: 'Error', error: simulated.errors }
    const results = simulated.resultType === 'single' ? [simulated.result] : simulated.results
    const ignored = [...new Set(results.flatMap((result) => result.ignoredContextKeys || []))]
    return { id: request.id, result: simulated.overallResult, ignored }
  } catch (error) {
    return { id: request.id, result: 'Error', error: String((error && error.stack) || error) }
  }
}

main().catch((error) => {
  process.stderr.write(String((error && error.stack) || error) + '\n')
  process.exit(2)
})
