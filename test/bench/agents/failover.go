package main

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// leading reports whether the manager serving metrics at addr is the
// leader (controller-runtime's leader_election_master_status).
func leading(addr string) bool {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "leader_election_master_status{") && strings.HasSuffix(line, " 1") {
			return true
		}
	}
	return false
}

// killLeader kills the leading replica (SIGKILL: no lease released, as a
// node failing) and waits for another to lead. It returns when it killed,
// and how long until the next leader led.
func (b *bench) killLeader() (killed time.Time, handover time.Duration, err error) {
	leader := -1
	for deadline := time.Now().Add(time.Minute); leader < 0; {
		for i, r := range b.replicas {
			if leading(r.metricsAddr) {
				leader = i
			}
		}
		if time.Now().After(deadline) {
			return time.Time{}, 0, fmt.Errorf("no replica leads")
		}
		if leader < 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	killed = time.Now()
	if err := b.replicas[leader].cmd.Process.Kill(); err != nil {
		return killed, 0, err
	}
	_ = b.replicas[leader].cmd.Wait()
	for deadline := time.Now().Add(2 * time.Minute); ; {
		for i, r := range b.replicas {
			if i != leader && leading(r.metricsAddr) {
				b.mgr, b.metricsAddr = r.cmd, r.metricsAddr
				return killed, time.Since(killed), nil
			}
		}
		if time.Now().After(deadline) {
			return killed, 0, fmt.Errorf("no replica took over within 2 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
