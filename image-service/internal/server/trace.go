package server

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	metal3 "github.com/agentboot/agentboot/api/metal3/v1alpha1"
	"github.com/agentboot/agentboot/internal/boottrace"
	"github.com/agentboot/agentboot/internal/macindex"
)

// The boot trace (docs/trace.md): the image service records the hops it
// serves by MAC and takes the PXE service's observations, into the
// Journal its boottrace.Writer writes to BootTraces.

// routeObservations takes the PXE service's observations.
const routeObservations = "POST /boot-observations"

// observe records a hop the image service served, when tracing is on.
func (h *Handler) observe(o boottrace.Observation) {
	if h.opts.Trace == nil {
		return
	}
	if err := o.Check(time.Now()); err != nil {
		h.opts.Log.V(1).Info("boot trace observation refused", "why", err.Error())
		return
	}
	_ = h.opts.Trace.Add(boottrace.SourceImageService, o)
}

// observeDownload records a boot file's download by the MAC that last
// asked for its boot script from the same address.
func (h *Handler) observeDownload(r *http.Request, file string, rec *statusRecorder) {
	hop := fileHops[file]
	if hop == "" || h.opts.Trace == nil || r.Method != http.MethodGet {
		return
	}
	mac := h.macs.MAC(h.clientAddr(r), time.Now())
	if mac == "" {
		return
	}
	o := boottrace.Observation{MAC: mac, Hop: hop, At: time.Now(), Detail: file + " from " + h.clientAddr(r)}
	switch {
	case rec.code/100 != 2:
		o.Outcome = fmt.Sprintf("HTTP %d", rec.code)
	case !rec.whole():
		o.Outcome = fmt.Sprintf("interrupted: %d of %d bytes sent", rec.bytes, rec.length)
	default:
		o.OK, o.Outcome = true, fmt.Sprintf("sent, %d bytes", rec.bytes)
	}
	h.observe(o)
}

// serveObservations takes a batch of the PXE service's observations,
// with the token both were given (--boot-observations-token-file): the
// boot network is hostile, and a batch is at most what the PXE service
// itself could have been made to see.
func (h *Handler) serveObservations(w http.ResponseWriter, r *http.Request) {
	if h.opts.Trace == nil || h.opts.ObservationsToken == "" {
		http.Error(w, "boot observations are off: start the image service with --boot-observations-token-file", http.StatusNotFound)
		return
	}
	got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	if subtle.ConstantTimeCompare([]byte(got), []byte(h.opts.ObservationsToken)) != 1 {
		http.Error(w, "unauthorized: the bearer token of --boot-observations-token-file is required", http.StatusUnauthorized)
		return
	}
	var b boottrace.Batch
	dec := json.NewDecoder(io.LimitReader(r.Body, boottrace.MaxBatchBytes+1))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		http.Error(w, "malformed batch: "+err.Error(), http.StatusBadRequest)
		return
	}
	if len(b.Observations) > boottrace.MaxBatch {
		http.Error(w, fmt.Sprintf("%d observations: at most %d a batch", len(b.Observations), boottrace.MaxBatch), http.StatusRequestEntityTooLarge)
		return
	}
	now := time.Now()
	for i := range b.Observations {
		if err := b.Observations[i].Check(now); err != nil {
			http.Error(w, fmt.Sprintf("observation %d: %v", i, err), http.StatusBadRequest)
			return
		}
	}
	full := 0
	for _, o := range b.Observations {
		if h.opts.Trace.Add(boottrace.SourcePXE, o) != nil {
			full++
		}
	}
	if full > 0 {
		w.Header().Set("Retry-After", "10")
		http.Error(w, fmt.Sprintf("%d of %d observations dropped: too many MACs waiting to be written", full, len(b.Observations)), http.StatusTooManyRequests)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// Claim says where a MAC's trace lives: the namespace of the InfraEnv the
// MAC boots into, as the boot script decides it.
func (h *Handler) Claim(ctx context.Context, mac string) (boottrace.Claim, error) {
	ie, outcome, why, err := h.infraEnvForMAC(ctx, mac)
	if err != nil {
		return boottrace.Claim{}, err
	}
	if ie == nil {
		return boottrace.Claim{Why: outcome + ": " + why}, nil
	}
	claim := boottrace.Claim{Namespace: ie.Namespace, InfraEnv: ie.Name, Why: "boots InfraEnv " + ie.Namespace + "/" + ie.Name, ByDefault: true}
	// A BareMetalHost of the InfraEnv's namespace that names the MAC
	// claims it; otherwise only the PXE default does.
	var hosts metal3.BareMetalHostList
	if err := h.opts.Reader.List(ctx, &hosts, client.InNamespace(ie.Namespace), client.MatchingFields{macindex.BootMAC: mac}); err != nil {
		return boottrace.Claim{}, err
	}
	if len(hosts.Items) > 0 {
		claim.ByDefault = false
		claim.Why += " (BareMetalHost " + hosts.Items[0].Name + ")"
	} else {
		claim.Why += " (its PXE default)"
	}
	return claim, nil
}
