package eventnote

import (
	"fmt"
	"regexp"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func TestAction(t *testing.T) {
	a, b := Action("Explain", "2 more Agent(s) wanted"), Action("Explain", "3 more Agent(s) wanted")
	if a == b || a != Action("Explain", "2 more Agent(s) wanted") || !regexp.MustCompile(`^Explain[0-9A-F]{8}$`).MatchString(a) {
		t.Fatalf("actions %q, %q: want one per note, stable, Explain<8 hex>", a, b)
	}
}

// captured records what reaches the wrapped recorder.
type captured []string

func (c *captured) Eventf(_, _ runtime.Object, eventtype, reason, action, note string, args ...any) {
	*c = append(*c, eventtype+" "+reason+" "+action+" "+fmt.Sprintf(note, args...))
}

func TestRecorder(t *testing.T) {
	var got captured
	r := Recorder(&got)
	r.Eventf(&corev1.Pod{}, nil, corev1.EventTypeWarning, "Failed", "Power", "set power %s: %d errors", "soft", 2)
	r.Eventf(&corev1.Pod{}, nil, corev1.EventTypeWarning, "Failed", "Power", "set power %s: %d errors", "off", 1)
	r.Eventf(&corev1.Pod{}, nil, corev1.EventTypeWarning, "Failed", "Power", "100%% sure")
	if len(got) != 3 || got[0] == got[1] || !regexp.MustCompile(`^Warning Failed Power[0-9A-F]{8} set power soft: 2 errors$`).MatchString(got[0]) ||
		!regexp.MustCompile(`^Warning Failed Power[0-9A-F]{8} 100% sure$`).MatchString(got[2]) {
		t.Fatalf("events %q: want each note formatted once, with an action of its own", got)
	}
}
