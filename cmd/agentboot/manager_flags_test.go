package main

import (
	"flag"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/agentboot/agentboot/internal/sanitize"
)

// The sanitization policy comes from the manager's flags only: a default
// level and per-InfraEnv levels, each checked as it is parsed.
func TestSanitizationFlags(t *testing.T) {
	parse := func(args ...string) (*managerFlags, error) {
		var a managerFlags
		fs := flag.NewFlagSet("manager", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		a.register(fs)
		return &a, fs.Parse(args)
	}
	a, err := parse()
	require.NoError(t, err)
	require.Equal(t, sanitize.Erase, a.nodePool().Sanitization.For("lab", "pool"), "erase unless told otherwise")

	a, err = parse("--disk-sanitization=metadata", "--disk-sanitization-infraenv", "lab/pool=none", "--disk-sanitization-infraenv", "lab/gpu=erase")
	require.NoError(t, err)
	p := a.nodePool().Sanitization
	require.Equal(t, sanitize.None, p.For("lab", "pool"))
	require.Equal(t, sanitize.Erase, p.For("lab", "gpu"))
	require.Equal(t, sanitize.Metadata, p.For("lab", "other"))

	_, err = parse("--disk-sanitization=shred")
	require.ErrorContains(t, err, `disk sanitization level "shred": want none, metadata or erase`)
	_, err = parse("--disk-sanitization-infraenv", "lab/pool=none", "--disk-sanitization-infraenv", "lab/pool=erase")
	require.ErrorContains(t, err, "InfraEnv lab/pool is already set to none")
	_, err = parse("--disk-sanitization-infraenv", "pool=none")
	require.ErrorContains(t, err, "want namespace/infraenv=level")
}

// A manager that serves no agent API refuses the agent API's limits
// instead of ignoring them.
func TestAgentAPIFlagsNeedAnAgentAPI(t *testing.T) {
	parse := func(args ...string) error {
		var a agentFlags
		fs := flag.NewFlagSet("manager", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		a.register(fs)
		if err := fs.Parse(args); err != nil {
			return err
		}
		return a.checkServed(fs)
	}
	require.NoError(t, parse("--max-unapproved-agents-per-infraenv=10"), "served in-process by default")
	require.NoError(t, parse("--agent-api-addr=", "--min-disk-size-gb=50"), "the Agent controller's own")
	require.ErrorContains(t, parse("--agent-api-addr=", "--max-unapproved-agents-per-infraenv=10", "--agent-api-write-budget=1000"),
		"--agent-api-write-budget, --max-unapproved-agents-per-infraenv set, but --agent-api-addr is empty")
}

// A service URL that hosts cannot use is refused naming its flag, and the
// settings are not made.
func TestURLFlagsNamed(t *testing.T) {
	good := discoveryFlags{agentAPIURL: "https://[2001:db8::10]:7443", imageURL: "https://[2001:db8::10]:8443", imageHTTPURL: "http://[2001:db8::10]:8080"}
	require.NoError(t, good.checkURLs())
	bad := good
	bad.imageHTTPURL = "http://2001:db8::10:8080"
	_, err := bad.settings()
	require.EqualError(t, err, `--image-service-http-url: image service HTTP URL "http://2001:db8::10:8080": an IPv6 address in a URL goes in brackets, as http://[2001:db8::1]:8080`)
	bad = good
	bad.agentAPIURL = "https://[fe80::1]:7443"
	require.ErrorContains(t, bad.checkURLs(), "--agent-api-url: agent API URL")
}
