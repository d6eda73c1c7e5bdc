// A small agent on the Vercel AI SDK, as an application would write it: the default `openai` provider (the
// Responses API), configured only by OPENAI_BASE_URL and OPENAI_API_KEY. Used by tests/test_node_clients.py.
//
//   node ai_sdk_agent.cjs generate|stream [--tool] PROMPT
//
// Prints one JSON object: the final text and finish reason, each step's tool calls and results, what the
// tool's execute function was called with, and (streaming) the text deltas as they arrived.
const { generateText, streamText, stepCountIs, tool } = require("ai");
const { openai } = require("@ai-sdk/openai");
const { z } = require("zod");

async function main() {
  const args = process.argv.slice(2);
  const mode = args.shift();
  const withTool = args[0] === "--tool" ? Boolean(args.shift()) : false;
  const prompt = args.join(" ");
  const executed = [];
  const tools = withTool ? {
    calculate: tool({
      description: "Evaluate an arithmetic expression.",
      inputSchema: z.object({ expression: z.string().describe("e.g. 6*7") }),
      execute: async ({ expression }) => {
        executed.push(expression);
        const [left, right] = expression.split("*").map(Number);  // products are all this test needs
        return String(left * right);
      },
    }),
  } : undefined;
  const settings = { model: openai(process.env.AGENT_MODEL || "stub-model"), prompt, tools, stopWhen: stepCountIs(4) };

  let result;
  const deltas = [];
  if (mode === "generate") {
    result = await generateText(settings);
  } else if (mode === "stream") {
    let failure;
    result = streamText({ ...settings, onError: ({ error }) => { failure = error; } });
    for await (const delta of result.textStream) deltas.push(delta);
    if (failure) throw failure;
  } else {
    throw new Error(`unknown mode ${mode}`);
  }
  const steps = await result.steps;
  console.log(JSON.stringify({
    text: await result.text,
    finishReason: await result.finishReason,
    usage: await result.totalUsage,
    deltas,
    executed,
    steps: steps.map((step) => ({
      text: step.text,
      finishReason: step.finishReason,
      responseId: step.response.id,
      modelId: step.response.modelId,
      toolCalls: step.toolCalls.map(({ toolCallId, toolName, input }) => ({ toolCallId, toolName, input })),
      toolResults: step.toolResults.map(({ toolCallId, toolName, output }) => ({ toolCallId, toolName, output })),
    })),
  }));
}

main().catch((error) => {
  console.error(error && error.stack ? error.stack : error);
  if (error && error.responseBody) console.error("response body:", error.responseBody);
  process.exit(1);
});
