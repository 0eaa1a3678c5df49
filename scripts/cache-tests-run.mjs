// Runs every http-cache-tests suite (its cli.mjs without the single-test mode, whose empty
// `npm_config_id` check needs npm) against BASE and prints the results as JSON:
//   node cache-tests-run.mjs SUITE_DIR BASE_URL
import { pathToFileURL } from 'node:url'
import path from 'node:path'

const [suiteDir, base] = process.argv.slice(2)
const load = async (p) => import(pathToFileURL(path.join(suiteDir, p)).href)
const { runTests, getResults } = await load('client/runner.mjs')
// node-fetch as the suite's cli.mjs uses it (npm hoists it beside the suite)
const { createRequire } = await import('node:module')
const require = createRequire(path.join(suiteDir, 'package.json'))
const fetch = (await import(pathToFileURL(require.resolve('node-fetch')).href)).default
const tests = [...(await load('tests/index.mjs')).default]
tests.push((await load('tests/surrogate-control.mjs')).default)
await runTests(tests, fetch, false, base)
console.log(JSON.stringify(getResults(), null, 2))
