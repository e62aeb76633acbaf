// The Ethereum client of the end-to-end test (tests/e2e_chain_test.go):
// ethers v6, with a workmesh node's /v1/rpc as its one endpoint, against a
// ganache chain (chain ID 1337, deterministic wallet) behind the network.
//
//   node tests/e2e/client.mjs http://127.0.0.1:PORT/v1/rpc
//
// It prints one JSON object on stdout with what it saw; the Go test checks
// it. Any failure prints {"error": ...} and exits 1.
import { JsonRpcProvider, Wallet, formatEther, parseEther } from "ethers";

const url = process.argv[2];
if (!url) {
  console.error("usage: node client.mjs <JSON-RPC URL>");
  process.exit(2);
}

// The first two accounts of ganache's --wallet.deterministic mnemonic
// ("myth like bonus scare over problem client lizard pioneer submit female collect").
const senderKey = "0x4f3edf983ac636a65a842ce7c78d9aa706d3b113bce9c46f30d7d21715b23b1d";
const receiver = "0xFFcf8FDEE72ac11b5c542428B35EEF5769C409f0";
const value = parseEther("1.25");

// Everything is bounded: the Go test kills the process too, but a hung
// request should say where it hung.
let step = "start";
const watchdog = setTimeout(() => fail(new Error(`no progress within 45s (at step ${step})`)), 45_000);

function fail(err) {
  process.stdout.write(JSON.stringify({ error: String(err?.stack ?? err), step }) + "\n");
  process.exit(1);
}

async function main() {
  const out = {};
  // No static network: ethers asks the endpoint for eth_chainId itself.
  // No cache: by default ethers answers a repeated call within 250ms from
  // its cache, and the balance after the transfer must come from the chain.
  const provider = new JsonRpcProvider(url, undefined, { polling: true, pollingInterval: 100, cacheTimeout: -1 });

  step = "getNetwork";
  const network = await provider.getNetwork();
  out.chainId = network.chainId.toString();

  step = "getBlockNumber";
  out.startBlock = await provider.getBlockNumber();

  step = "balances before";
  const before = await provider.getBalance(receiver);
  out.receiverBefore = before.toString();

  // A value transfer signed here (eth_sendRawTransaction), then its receipt.
  step = "sendTransaction";
  const wallet = new Wallet(senderKey, provider);
  out.sender = wallet.address;
  const tx = await wallet.sendTransaction({ to: receiver, value });
  out.txHash = tx.hash;
  step = "wait for the receipt";
  const receipt = await tx.wait(1, 30_000);
  out.receipt = { status: receipt.status, blockNumber: receipt.blockNumber, hash: receipt.hash, from: receipt.from, to: receipt.to };

  step = "getBalance after";
  const after = await provider.getBalance(receiver);
  out.receiverAfter = after.toString();
  out.value = value.toString();
  out.receiverGainedEth = formatEther(after - before);

  step = "getBlock of the receipt";
  const mined = await provider.getBlock(receipt.blockNumber);
  out.minedBlock = { number: mined.number, hash: mined.hash, transactions: [...mined.transactions] };

  // ethers batches calls made in the same tick into one JSON-RPC batch.
  step = "ethers batch";
  const [genesis, balanceAtGenesis, nonce] = await Promise.all([
    provider.getBlock(0),
    provider.getBalance(receiver, 0),
    provider.getTransactionCount(wallet.address),
  ]);
  out.ethersBatch = { genesisNumber: genesis.number, balanceAtGenesis: balanceAtGenesis.toString(), senderNonce: nonce };

  // A raw batch, as any client may send it: answers in request order, ids
  // kept, one error among results.
  step = "raw batch";
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify([
      { jsonrpc: "2.0", id: 11, method: "eth_chainId", params: [] },
      { jsonrpc: "2.0", id: "b", method: "eth_getBalance", params: [receiver, "latest"] },
      { jsonrpc: "2.0", id: 13, method: "eth_noSuchMethod", params: [] },
      { jsonrpc: "2.0", id: 14, method: "eth_getTransactionByHash", params: [tx.hash] },
    ]),
    signal: AbortSignal.timeout(20_000),
  });
  out.rawBatch = { status: res.status, body: await res.json() };

  // Last, so that nothing after it can ask for the same block: the block
  // after the head, which no node has. The null is the answer.
  step = "beyond the head";
  const head = await provider.getBlockNumber();
  out.head = head;
  const atHead = await provider.getBlock(head);
  out.atHeadNumber = atHead?.number ?? null;
  const beyond = await provider.getBlock(head + 1);
  out.beyondHead = { number: head + 1, hex: "0x" + (head + 1).toString(16), block: beyond };

  provider.destroy();
  return out;
}

main().then(
  (out) => {
    clearTimeout(watchdog);
    process.stdout.write(JSON.stringify(out) + "\n");
  },
  fail,
);
