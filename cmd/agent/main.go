// Command agent is agentboot's on-host discovery agent: a small static binary
// that the discovery image starts. It must not link client-go.
package main

import (
	"fmt"
	"os"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Println(version)
		return
	}
	fmt.Fprintln(os.Stderr, "usage: agent version")
	os.Exit(2)
}
