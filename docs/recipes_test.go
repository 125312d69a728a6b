// Package docs_test keeps the README's network-boot recipes identical to the
// files the VM lab boots VMs with (docs/recipes).
package docs_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestREADMEShowsTheTestedRecipes(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	recipes, err := filepath.Glob("recipes/*.conf")
	if err != nil || len(recipes) == 0 {
		t.Fatalf("no recipes: %v", err)
	}
	for _, r := range recipes {
		text, err := os.ReadFile(r)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(readme), "```\n"+string(text)+"```\n") {
			t.Errorf("README.md does not show %s verbatim in a code block", r)
		}
	}
}
