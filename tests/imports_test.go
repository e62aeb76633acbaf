package tests

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestPackageGraph holds the layout's import rules (DESIGN.md, the
// packages' doc.go): the selection core imports only config; the workers
// vocabulary and the API's bodies (node/apiv1, what the CLI's client
// commands read) reach no libp2p and no net/http; nothing under node
// imports workers; cmd reaches the selection core only through the
// workers packages; nothing imports cmd; and each workers package imports
// only the parts below it.
func TestPackageGraph(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list on the module")
	}
	const mod = "github.com/workmesh/workmesh/"
	list := func(args ...string) map[string][]string {
		t.Helper()
		out, err := exec.Command("go", append([]string{"list"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %v: %v\n%s", args, err, out)
		}
		graph := map[string][]string{}
		for line := range strings.Lines(string(out)) {
			pkg, imports, _ := strings.Cut(strings.TrimSpace(line), ": ")
			graph[strings.TrimPrefix(pkg, mod)] = strings.Fields(imports)
		}
		return graph
	}
	direct := list("-f", "{{.ImportPath}}: {{join .Imports \" \"}}", mod+"...")
	deps := list("-f", "{{.ImportPath}}: {{join .Deps \" \"}}", mod+"workers", mod+"node/apiv1", mod+"selection")

	for _, pkg := range []string{"workers", "node/apiv1", "selection"} {
		if len(deps[pkg]) == 0 {
			t.Fatalf("no dependencies listed for %s", pkg)
		}
		for _, d := range deps[pkg] {
			if strings.Contains(d, "libp2p") || d == "net/http" {
				t.Errorf("%s reaches %s", pkg, d)
			}
		}
	}
	// allowed lists, for each package, the workmesh packages it may import
	// directly; a package not listed may import any.
	allowed := map[string][]string{
		"selection":        {"config"},
		"config":           {},
		"pubsub":           {},
		"node/apiv1":       {"selection"},
		"workers":          {"selection"},
		"workers/builtin":  {"workers"},
		"workers/pool":     {"workers", "config", "node", "node/scrape"},
		"workers/protocol": {"workers", "workers/pool", "workers/reqctx", "config", "node/frame", "node/scrape"},
		"workers/reqctx":   {},
		"workers/access":   {"workers", "config"},
		"workers/faults":   {"workers", "workers/pool", "config", "node", "node/httpapi", "node/apiv1"},
		"workers/httpwork": {"workers", "config"},
		"workers/custom":   {"workers", "config"},
		"workers/stack": {"config", "node", "node/authority", "node/apiv1", "node/httpapi", "workers", "workers/access", "workers/api", "workers/builtin",
			"workers/custom", "workers/dispatch", "workers/faults", "workers/httpwork", "workers/jsonrpc", "workers/pool", "workers/protocol"},
		"workers/jsonrpc":    {"workers", "workers/httpwork", "config", "node/httpapi"},
		"workers/dispatch":   {"workers", "workers/builtin", "workers/pool", "workers/protocol", "workers/reqctx", "config", "node", "node/apiv1", "node/scrape", "selection"},
		"workers/workertest": {"workers", "workers/builtin", "workers/pool", "config"},
		"node/authority":     {},
	}
	for pkg, imports := range direct {
		for _, imp := range imports {
			if !strings.HasPrefix(imp, mod) {
				continue
			}
			imp = strings.TrimPrefix(imp, mod)
			switch {
			case imp == "cmd/workmesh":
				t.Errorf("%s imports cmd", pkg)
			case strings.HasPrefix(pkg, "node") && strings.HasPrefix(imp, "workers"):
				t.Errorf("%s imports %s: node must not know workers", pkg, imp)
			case pkg == "cmd/workmesh" && imp == "selection":
				t.Errorf("cmd imports selection: it reads the core through the dispatcher's read models")
			}
			if want, ok := allowed[pkg]; ok && !slices.Contains(want, imp) {
				t.Errorf("%s imports %s; it may import only %v", pkg, imp, want)
			}
		}
	}
}
