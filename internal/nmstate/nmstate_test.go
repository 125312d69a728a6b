package nmstate

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
)

func config(name, rv string) v1beta1.NMStateConfig {
	return v1beta1.NMStateConfig{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv}}
}

func TestFingerprint(t *testing.T) {
	a := Fingerprint([]v1beta1.NMStateConfig{config("b", "7"), config("a", "3")})
	if b := Fingerprint([]v1beta1.NMStateConfig{config("a", "3"), config("b", "7")}); a != b || a != "a@3,b@7" {
		t.Fatalf("order changed the fingerprint: %q, %q", a, b)
	}
	if c := Fingerprint([]v1beta1.NMStateConfig{config("a", "4"), config("b", "7")}); c == a {
		t.Fatal("an edited config kept the fingerprint")
	}
	if Fingerprint(nil) != "" {
		t.Fatal("no configs, no fingerprint")
	}
}

// An InfraEnv without a selector carries no static network config, and the
// apiserver is not even asked (a nil reader would panic).
func TestEmptySelectorSelectsNothing(t *testing.T) {
	got, err := Select(context.Background(), nil, &v1beta1.InfraEnv{})
	if err != nil || got != nil {
		t.Fatalf("got %v, %v", got, err)
	}
}
