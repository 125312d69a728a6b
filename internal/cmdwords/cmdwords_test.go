package cmdwords

import (
	"reflect"
	"testing"
)

func TestSplit(t *testing.T) {
	for in, want := range map[string][]string{
		"":                                   nil,
		"  a  b\tc\n":                        {"a", "b", "c"},
		`console=ttyS0 dyndbg="file x +p" q`: {"console=ttyS0", `dyndbg="file x +p"`, "q"},
		`a="unterminated b c`:                {`a="unterminated b c`},
		"/usr/local/bin/agent run --config /etc/agentboot/agent.json": {"/usr/local/bin/agent", "run", "--config", "/etc/agentboot/agent.json"},
	} {
		if got := Split(in); !reflect.DeepEqual(got, want) {
			t.Errorf("Split(%q) = %q, want %q", in, got, want)
		}
	}
}
