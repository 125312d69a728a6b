package eventnote

import "testing"

func TestAction(t *testing.T) {
	a, b := Action("Explain", "2 more Agent(s) wanted"), Action("Explain", "3 more Agent(s) wanted")
	if a == b || a != Action("Explain", "2 more Agent(s) wanted") || len(a) != len("Explain-")+8 {
		t.Fatalf("actions %q, %q: want one per note, stable, verb-<8 hex>", a, b)
	}
}
