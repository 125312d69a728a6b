// Package ntp adds the InfraEnv's NTP sources to the host's chrony and
// reports the sources chrony uses. Hosts without chrony (the dev OS) report
// none; the service then judges time sync by the host's clock alone.
package ntp

import (
	"context"
	"log/slog"
	"os/exec"
	"strings"
	"time"

	"github.com/agentboot/agentboot/internal/agentwire"
)

// AddSources adds each source to chrony at runtime.
func AddSources(ctx context.Context, sources []string, log *slog.Logger) {
	chronyc, err := exec.LookPath("chronyc")
	if err != nil || len(sources) == 0 {
		return
	}
	for _, s := range sources {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		out, err := exec.CommandContext(ctx, chronyc, "add", "server", s, "iburst").CombinedOutput()
		cancel()
		if err != nil {
			log.Warn("add NTP source", "source", s, "err", err, "output", strings.TrimSpace(string(out)))
		}
	}
}

// Sources reads `chronyc -c -n sources`.
func Sources(ctx context.Context) []agentwire.NTPSource {
	chronyc, err := exec.LookPath("chronyc")
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, chronyc, "-c", "-n", "sources").Output()
	if err != nil {
		return nil
	}
	return Parse(string(out))
}

// states maps chrony's source state characters to assisted-service's words.
var states = map[string]string{
	"*": "synced", "+": "combined", "-": "not_combined", "?": "unreachable", "x": "error", "~": "variable",
}

// Parse reads chronyc's CSV output (mode, state, name, ...).
func Parse(out string) []agentwire.NTPSource {
	var srcs []agentwire.NTPSource
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, ",")
		if len(f) < 3 {
			continue
		}
		state, ok := states[f[1]]
		if !ok {
			state = "error"
		}
		srcs = append(srcs, agentwire.NTPSource{SourceName: f[2], SourceState: state})
	}
	return srcs
}
