package boottrace

import (
	"context"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentboot/agentboot/api/agentboot/v1alpha1"
	v1beta1 "github.com/agentboot/agentboot/api/agentinstall/v1beta1"
	"github.com/agentboot/agentboot/internal/agentwire"
)

// Report is one MAC's boot path as its reader may read it: its trace, the
// Agent of the host that has it, where the host stopped, and what the
// reader was not allowed to read.
type Report struct {
	MAC       string
	Trace     *v1alpha1.BootTrace
	Agent     *v1beta1.Agent
	Diagnosis Diagnosis
	// Unclaimed: nothing claims the MAC (its trace is in agentboot's
	// namespace).
	Unclaimed bool
	// Hidden says what the reader may not read that could hold more.
	Hidden []string
}

// IsMAC reports whether s names a MAC (colons or dashes, any case).
func IsMAC(s string) bool {
	return agentwire.MACForm.MatchString(strings.ToLower(strings.ReplaceAll(s, "-", ":")))
}

// Lookup finds the boot path of a MAC, or of each MAC of an Agent named
// arg in namespace, with the reader's own rights: what it may not read is
// left out and said (Hidden), never read another way.
func Lookup(ctx context.Context, c client.Reader, arg, namespace, home string) ([]Report, error) {
	if IsMAC(arg) {
		mac := strings.ToLower(strings.ReplaceAll(arg, "-", ":"))
		r := Report{MAC: mac}
		traces, hidden, err := traces(ctx, c, mac, namespace)
		if err != nil {
			return nil, err
		}
		r.Hidden = hidden
		if len(traces) > 0 {
			r.Trace = latestTrace(traces)
		}
		// The Agent with the MAC in the trace's namespace (a host's MACs
		// are what it reports: never one of another namespace's).
		nss := []string{namespace}
		if r.Trace != nil {
			nss = []string{r.Trace.Namespace}
			if Unclaimed(r.Trace, home) {
				nss = nil
			}
		}
		for _, ns := range nss {
			if ns == "" || r.Agent != nil {
				continue
			}
			a, err := agentWithMAC(ctx, c, ns, mac)
			if apierrors.IsForbidden(err) {
				r.Hidden = append(r.Hidden, "Agents in namespace "+ns)
				continue
			}
			if err != nil {
				return nil, err
			}
			r.Agent = a
		}
		r.finish(home)
		return []Report{r}, nil
	}
	if namespace == "" {
		return nil, fmt.Errorf("%q is not a MAC address: name an Agent with its namespace (-n)", arg)
	}
	var a v1beta1.Agent
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: arg}, &a); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("no Agent %s in namespace %s", arg, namespace)
		}
		return nil, err
	}
	var out []Report
	for _, mac := range agentMACs(&a) {
		r := Report{MAC: mac, Agent: &a}
		// Its trace in its own namespace only.
		var list v1alpha1.BootTraceList
		err := c.List(ctx, &list, client.InNamespace(namespace), client.MatchingLabels{v1alpha1.MACLabel: Label(mac)})
		switch {
		case apierrors.IsForbidden(err):
			r.Hidden = append(r.Hidden, "BootTraces in namespace "+namespace)
		case err != nil:
			return nil, err
		case len(list.Items) > 0:
			r.Trace = latestTrace(list.Items)
		}
		r.finish(home)
		out = append(out, r)
	}
	if len(out) == 0 {
		r := Report{Agent: &a}
		r.finish(home)
		out = append(out, r)
	}
	return out, nil
}

func (r *Report) finish(home string) {
	r.Unclaimed = r.Trace != nil && Unclaimed(r.Trace, home)
	r.Diagnosis = Diagnose(r.Trace, r.Agent)
}

// traces lists the MAC's traces in every namespace, or, when the reader
// may not list them all, in namespace.
func traces(ctx context.Context, c client.Reader, mac, namespace string) ([]v1alpha1.BootTrace, []string, error) {
	var list v1alpha1.BootTraceList
	sel := client.MatchingLabels{v1alpha1.MACLabel: Label(mac)}
	err := c.List(ctx, &list, sel)
	if err == nil {
		return list.Items, nil, nil
	}
	if !apierrors.IsForbidden(err) {
		return nil, nil, err
	}
	hidden := []string{"BootTraces in other namespaces"}
	if namespace == "" {
		return nil, hidden, nil
	}
	if err := c.List(ctx, &list, sel, client.InNamespace(namespace)); err != nil {
		if apierrors.IsForbidden(err) {
			return nil, append(hidden, "BootTraces in namespace "+namespace), nil
		}
		return nil, nil, err
	}
	return list.Items, hidden, nil
}

// latestTrace is the trace last seen (a MAC that moved between
// namespaces has one in each).
func latestTrace(traces []v1alpha1.BootTrace) *v1alpha1.BootTrace {
	slices.SortFunc(traces, func(a, b v1alpha1.BootTrace) int { return lastSeen(&b).Compare(lastSeen(&a)) })
	return &traces[0]
}

func agentWithMAC(ctx context.Context, c client.Reader, ns, mac string) (*v1beta1.Agent, error) {
	var agents v1beta1.AgentList
	if err := c.List(ctx, &agents, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	for i := range agents.Items {
		if slices.Contains(agentMACs(&agents.Items[i]), mac) {
			return &agents.Items[i], nil
		}
	}
	return nil, nil
}

// agentMACs are the MACs of an Agent's interfaces, as its inventory lists
// them.
func agentMACs(a *v1beta1.Agent) []string {
	var out []string
	for _, i := range a.Status.Inventory.Interfaces {
		if m := strings.ToLower(i.MacAddress); IsMAC(m) && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}
