package jsonrpc

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestBlockOf(t *testing.T) {
	for _, c := range []struct {
		method, params string
		want           uint64
		ok             bool
	}{
		{"eth_getBlockByNumber", `["0x65", false]`, 101, true},
		{"eth_getBlockByNumber", `["0X0", true]`, 0, true},
		{"eth_getBlockByNumber", `[101, false]`, 101, true},
		{"eth_getBlockByNumber", `["latest", false]`, 0, false},
		{"eth_getBlockByNumber", `["pending", false]`, 0, false},
		{"eth_getBlockByNumber", `["earliest", false]`, 0, false},
		{"eth_getBlockByNumber", `["safe", false]`, 0, false},
		{"eth_getBlockByNumber", `["finalized", false]`, 0, false},
		{"eth_getBlockByNumber", `[]`, 0, false},
		{"eth_getBlockByNumber", `{"block": "0x1"}`, 0, false},
		{"eth_getBlockByNumber", `["0x", false]`, 0, false},
		{"eth_getBlockByNumber", `["0xzz", false]`, 0, false},
		{"eth_getBlockByNumber", `["0x10000000000000000", false]`, 0, false},
		{"eth_getBlockByNumber", `["101", false]`, 0, false},
		{"eth_getBlockByNumber", `[-1, false]`, 0, false},
		{"eth_getBlockTransactionCountByNumber", `["0x10"]`, 16, true},
		{"eth_getUncleCountByBlockNumber", `["0x10"]`, 16, true},
		{"eth_getTransactionByBlockNumberAndIndex", `["0x10", "0x0"]`, 16, true},
		{"eth_getBalance", `["0xabc", "0x20"]`, 32, true},
		{"eth_getBalance", `["0xabc"]`, 0, false},
		{"eth_getBalance", `["0xabc", "latest"]`, 0, false},
		{"eth_getBalance", `["0xabc", {"blockNumber": "0x21"}]`, 33, true},
		{"eth_getBalance", `["0xabc", {"blockHash": "0x` + strings.Repeat("ab", 32) + `"}]`, 0, false},
		{"eth_getBalance", `["0xabc", "0x` + strings.Repeat("ab", 32) + `"]`, 0, false},
		{"eth_getCode", `["0xabc", "0x22"]`, 34, true},
		{"eth_getTransactionCount", `["0xabc", "0x23"]`, 35, true},
		{"eth_call", `[{"to": "0xabc"}, "0x24"]`, 36, true},
		{"eth_call", `[{"to": "0xabc"}]`, 0, false},
		{"eth_getStorageAt", `["0xabc", "0x0", "0x25"]`, 37, true},
		{"eth_getStorageAt", `["0xabc", "0x25"]`, 0, false},
		{"eth_getLogs", `[{"fromBlock": "0x10", "toBlock": "0x20"}]`, 32, true},
		{"eth_getLogs", `[{"fromBlock": "0x30", "toBlock": "latest"}]`, 48, true},
		{"eth_getLogs", `[{"toBlock": "0x20"}]`, 32, true},
		{"eth_getLogs", `[{"fromBlock": "latest"}]`, 0, false},
		{"eth_getLogs", `[{"blockHash": "0xab", "fromBlock": "0x1"}]`, 0, false},
		{"eth_getLogs", `[]`, 0, false},
		{"eth_blockNumber", `[]`, 0, false},
		{"eth_getTransactionReceipt", `["0x12"]`, 0, false},
		{"eth_getBlockByHash", `["0x12", false]`, 0, false},
		{"eth_getBlockByNumber", `not json`, 0, false},
	} {
		got, ok := BlockOf(c.method, json.RawMessage(c.params))
		if got != c.want || ok != c.ok {
			t.Errorf("BlockOf(%s, %s) = %d, %v; want %d, %v", c.method, c.params, got, ok, c.want, c.ok)
		}
	}
}

// Only a payload of nothing but reads may be hedged: one write in a batch,
// a filter (which lives on one node), an unknown method or a payload that
// is not JSON-RPC makes it not.
func TestJSONRPC_ReadOnly(t *testing.T) {
	for _, c := range []struct {
		payload string
		want    bool
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","params":[]}`, true},
		{`{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":["0xaa","0x10"]}`, true},
		{`{"jsonrpc":"2.0","id":1,"method":"eth_getLogs","params":[{"fromBlock":"0x1"}]}`, true},
		{`  [{"jsonrpc":"2.0","id":1,"method":"eth_call","params":[{},"latest"]},{"jsonrpc":"2.0","id":2,"method":"eth_getTransactionReceipt","params":["0x1"]}]`, true},
		{`{"jsonrpc":"2.0","id":1,"method":"eth_sendRawTransaction","params":["0x00"]}`, false},
		{`[{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber"},{"jsonrpc":"2.0","id":2,"method":"eth_sendRawTransaction","params":["0x00"]}]`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"eth_newFilter","params":[{}]}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"eth_getFilterChanges","params":["0x1"]}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"no_such_method"}`, false},
		{`[]`, false},
		{`not json`, false},
		{``, false},
	} {
		if got := ReadOnly([]byte(c.payload)); got != c.want {
			t.Errorf("ReadOnly(%s) = %v, want %v", c.payload, got, c.want)
		}
	}
}
