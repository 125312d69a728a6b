// Command hello stands in for agentboot and the agents in the image
// builder's tests: a small Go binary with build information.
package main

func main() {}
