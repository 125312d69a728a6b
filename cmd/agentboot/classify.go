package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/agentboot/agentboot/agentclassification"
)

// runClassifyWorker answers the manager's AgentClassification queries in a
// process of their own, its address space capped (docs/agents.md).
func runClassifyWorker(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("classify-worker", flag.ContinueOnError)
	memory := fs.Int64("memory-mib", agentclassification.DefaultWorkerMemory>>20, "MiB of address space this worker may use beyond its own start")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *memory < 16 {
		return fmt.Errorf("--memory-mib %d: at least 16 (a query's inventory and its compiled program need some)", *memory)
	}
	return agentclassification.Worker(os.Stdin, os.Stdout, *memory<<20, agentclassification.DefaultTimeout)
}
