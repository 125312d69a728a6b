package lifecycle

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// agentAPI is the package that declares the Agent.
const agentAPI = "github.com/agentboot/agentboot/api/agentinstall/v1beta1"

// stateTypes are the parts of an Agent's status that carry its state:
// whatever assigns one of their fields, builds one, or hands out a pointer
// into one changes the Agent's state.
var stateTypes = []string{"AgentStatus", "HostProgressInfo", "AgentDiskSanitization", "AgentRegistration", "AgentDebugInfo"}

// The Agent's state has one writer: every change to its status —
// registration, inventory, validations, installation, sanitization,
// release — is made by this package's functions (state in, changed state
// out), and the other packages only send the result to the apiserver. The
// test type-checks every product package (not tests, not test/) and fails
// on any statement outside this package that assigns a field of the
// Agent's status, builds one of its parts, or takes the address of one
// except to hand it to this package. A raw JSON patch of an Agent's status
// would slip past the type checker, so RawPatch is refused outside this
// package too.
func TestOnlyLifecycleWritesAgentState(t *testing.T) {
	root, mod := module(t)
	pkgs := listPackages(t, root)
	exports := map[string]string{}
	for _, p := range pkgs {
		exports[p.ImportPath] = p.Export
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, errors.New("no export data for " + path)
		}
		return os.Open(f)
	})
	self := mod + "/internal/lifecycle"
	t.Run("catches", func(t *testing.T) { checkFixture(t, fset, imp, self) })
	var found []string
	checked := 0
	for _, p := range pkgs {
		if p.Module == nil || p.Module.Path != mod || p.ImportPath == self || strings.HasPrefix(p.ImportPath, mod+"/test/") || strings.HasPrefix(p.ImportPath, mod+"/api/") {
			continue
		}
		if len(p.CgoFiles) > 0 {
			t.Fatalf("%s has cgo files; this test cannot type-check it", p.ImportPath)
		}
		var files []*ast.File
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Selections: map[*ast.SelectorExpr]*types.Selection{}, Uses: map[*ast.Ident]types.Object{}}
		if _, err := (&types.Config{Importer: imp}).Check(p.ImportPath, fset, files, info); err != nil {
			t.Fatalf("type-check %s: %v", p.ImportPath, err)
		}
		checked++
		for _, f := range files {
			found = append(found, stateWrites(fset, info, self, f)...)
		}
	}
	if checked < 20 {
		t.Fatalf("type-checked only %d packages: the package list is wrong", checked)
	}
	if len(found) > 0 {
		t.Errorf("the Agent's state is written outside internal/lifecycle (%d places); make the change a lifecycle function and send its result:\n%s", len(found), strings.Join(found, "\n"))
	}
}

type listed struct {
	ImportPath, Dir, Export string
	GoFiles, CgoFiles       []string
	Module                  *struct{ Path string }
}

func module(t *testing.T) (root, path string) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}} {{.Path}}").Output()
	if err != nil {
		t.Fatalf("go list -m: %v", err)
	}
	root, path, _ = strings.Cut(strings.TrimSpace(string(out)), " ")
	return root, path
}

func listPackages(t *testing.T, root string) []listed {
	cmd := exec.Command("go", "list", "-deps", "-export", "-json=ImportPath,Dir,Export,GoFiles,CgoFiles,Module", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -export: %v\n%s", err, stderr.String())
	}
	var pkgs []listed
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p listed
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// stateWrites lists where f writes the Agent's state.
func stateWrites(fset *token.FileSet, info *types.Info, self string, f *ast.File) []string {
	var found []string
	report := func(n ast.Node, what string) {
		found = append(found, "  "+fset.Position(n.Pos()).String()+": "+what)
	}
	// lifecycleArgs are the &x expressions handed straight to this package.
	lifecycleArgs := map[ast.Expr]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if fn := callee(info, call); fn != nil && fn.Pkg() != nil && fn.Pkg().Path() == self {
			for _, a := range call.Args {
				lifecycleArgs[a] = true
			}
		}
		if fn := callee(info, call); fn != nil && fn.Pkg() != nil && fn.Pkg().Path() == "sigs.k8s.io/controller-runtime/pkg/client" && fn.Name() == "RawPatch" {
			report(call, "a raw patch (it may write the Agent's status unseen)")
		}
		// A clientset's or dynamic client's write of a status subresource
		// names it as its last argument.
		if n := len(call.Args); n > 0 {
			if lit, ok := call.Args[n-1].(*ast.BasicLit); ok && lit.Kind == token.STRING && lit.Value == `"status"` {
				if fn := callee(info, call); fn != nil && (fn.Name() == "Patch" || fn.Name() == "Update" || fn.Name() == "UpdateStatus") {
					report(call, "a write of a status subresource by name (it may write the Agent's status unseen)")
				}
			}
		}
		return true
	})
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if n.Tok == token.DEFINE {
				return true
			}
			for _, l := range n.Lhs {
				if what := touches(info, l); what != "" {
					report(l, "assigns "+what)
				}
			}
		case *ast.IncDecStmt:
			if what := touches(info, n.X); what != "" {
				report(n, "changes "+what)
			}
		case *ast.UnaryExpr:
			if n.Op != token.AND || lifecycleArgs[n] {
				return true
			}
			if what := touches(info, n.X); what != "" {
				report(n, "takes the address of "+what)
			}
		case *ast.CompositeLit:
			tv := info.Types[n]
			if name := stateType(tv.Type); name != "" {
				report(n, "builds a "+name)
				return true
			}
			if named := namedOf(tv.Type); named != nil && named.Obj().Name() == "Agent" && named.Obj().Pkg().Path() == agentAPI {
				for _, e := range n.Elts {
					if kv, ok := e.(*ast.KeyValueExpr); ok {
						if id, ok := kv.Key.(*ast.Ident); ok && id.Name == "Status" {
							report(kv, "builds an Agent with a status")
						}
					}
				}
			}
		case *ast.CallExpr:
			// A method with a pointer receiver called on a part of the
			// status changes it as much as an assignment.
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok {
				// (DeepCopy and DeepCopyInto only read their receiver.)
				if s := info.Selections[sel]; s != nil && s.Kind() == types.MethodVal && sel.Sel.Name != "DeepCopy" && sel.Sel.Name != "DeepCopyInto" {
					if sig, ok := s.Obj().Type().(*types.Signature); ok && sig.Recv() != nil {
						if _, ptr := sig.Recv().Type().(*types.Pointer); ptr {
							if _, already := s.Recv().(*types.Pointer); !already {
								if what := touches(info, sel.X); what != "" {
									report(n, "calls "+sel.Sel.Name+" on "+what)
								}
							}
						}
					}
				}
			}
		}
		return true
	})
	return found
}

// touches says which part of the Agent's state the expression x (the
// left-hand side of an assignment, say) reaches into, or "" if none. A
// part reached through an Agent's status, or through a pointer to one of
// its parts, is the Agent's; a field of a part copied into a local value
// is not (writing the copy back is).
func touches(info *types.Info, x ast.Expr) string {
	what, agents := "", false
	for {
		switch e := x.(type) {
		case *ast.ParenExpr:
			x = e.X
			continue
		case *ast.StarExpr:
			x = e.X
			continue
		case *ast.IndexExpr:
			x = e.X
			continue
		case *ast.SelectorExpr:
			s := info.Selections[e]
			if s == nil || s.Kind() != types.FieldVal {
				return ""
			}
			owner := fieldOwner(s)
			if name := stateType(owner); name != "" {
				if what == "" {
					what = name + "." + e.Sel.Name
				}
				if _, ptr := info.Types[e.X].Type.(*types.Pointer); ptr {
					agents = true
				}
			}
			if named := namedOf(owner); named != nil && named.Obj().Name() == "Agent" && named.Obj().Pkg().Path() == agentAPI && e.Sel.Name == "Status" {
				if what == "" {
					what = "Agent.Status"
				}
				agents = true
			}
			x = e.X
			continue
		}
		if agents {
			return what
		}
		return ""
	}
}

// fieldOwner is the struct type that declares the field s selects, after
// any embedded fields it was promoted through.
func fieldOwner(s *types.Selection) types.Type {
	t := s.Recv()
	idx := s.Index()
	for _, i := range idx[:len(idx)-1] {
		st, ok := deref(t).Underlying().(*types.Struct)
		if !ok {
			return nil
		}
		t = st.Field(i).Type()
	}
	return deref(t)
}

func deref(t types.Type) types.Type {
	if p, ok := t.(*types.Pointer); ok {
		return p.Elem()
	}
	return t
}

func namedOf(t types.Type) *types.Named {
	if t == nil {
		return nil
	}
	n, _ := deref(t).(*types.Named)
	return n
}

// stateType names t if it is one of stateTypes.
func stateType(t types.Type) string {
	n := namedOf(t)
	if n == nil || n.Obj().Pkg() == nil || n.Obj().Pkg().Path() != agentAPI || !slices.Contains(stateTypes, n.Obj().Name()) {
		return ""
	}
	return n.Obj().Name()
}

// callee is the function or method call calls, or nil.
func callee(info *types.Info, call *ast.CallExpr) *types.Func {
	var id *ast.Ident
	switch f := ast.Unparen(call.Fun).(type) {
	case *ast.Ident:
		id = f
	case *ast.SelectorExpr:
		id = f.Sel
	case *ast.IndexExpr: // a generic function instantiated explicitly
		if sel, ok := f.X.(*ast.SelectorExpr); ok {
			id = sel.Sel
		} else if i, ok := f.X.(*ast.Ident); ok {
			id = i
		}
	}
	if id == nil {
		return nil
	}
	fn, _ := info.Uses[id].(*types.Func)
	return fn
}

// fixture writes the Agent's state every way the test knows, and reads it
// and writes other objects in ways it must let pass.
const fixture = `package fixture

import (
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/lifecycle"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func f(a *v1beta1.Agent) {
	a.Status.Progress.CurrentStage = "x"
	a.Status.Conditions[0].Reason = "y"
	st := &a.Status
	st.Role = "worker"
	a.Status.Progress.InstallationPercentage++
	_ = v1beta1.AgentRegistration{}
	_ = &v1beta1.Agent{Status: v1beta1.AgentStatus{}}
	_ = client.RawPatch("", nil)
	var dyn interface {
		Patch(name string, data []byte, subresources ...string) error
	}
	_ = dyn.Patch("x", nil, "status")
	lifecycle.OweSanitization(&a.Status, "erase", "why")
	_ = a.Status.DeepCopy()
	b := a.Status.Progress
	b.CurrentStage = "z"
	var ie v1beta1.InfraEnv
	ie.Status.Conditions = nil
	a.Labels = nil
	ds := a.Status.DiskSanitization
	ds.Keep = nil
}
`

func checkFixture(t *testing.T, fset *token.FileSet, imp types.Importer, self string) {
	f, err := parser.ParseFile(fset, "fixture.go", fixture, 0)
	if err != nil {
		t.Fatal(err)
	}
	info := &types.Info{Types: map[ast.Expr]types.TypeAndValue{}, Selections: map[*ast.SelectorExpr]*types.Selection{}, Uses: map[*ast.Ident]types.Object{}}
	if _, err := (&types.Config{Importer: imp}).Check("fixture", fset, []*ast.File{f}, info); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"  fixture.go:17:6: a raw patch (it may write the Agent's status unseen)",
		"  fixture.go:21:6: a write of a status subresource by name (it may write the Agent's status unseen)",
		"  fixture.go:10:2: assigns HostProgressInfo.CurrentStage",
		"  fixture.go:11:2: assigns AgentStatus.Conditions",
		"  fixture.go:12:8: takes the address of Agent.Status",
		"  fixture.go:13:2: assigns AgentStatus.Role",
		"  fixture.go:14:2: changes HostProgressInfo.InstallationPercentage",
		"  fixture.go:15:6: builds a AgentRegistration",
		"  fixture.go:16:21: builds an Agent with a status",
		"  fixture.go:16:29: builds a AgentStatus",
		"  fixture.go:30:2: assigns AgentDiskSanitization.Keep",
	}
	if diff := cmp.Diff(want, stateWrites(fset, info, self, f)); diff != "" {
		t.Errorf("what the check finds in the fixture (-want +got):\n%s", diff)
	}
}
