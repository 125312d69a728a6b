package driver

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Operations, the values of the operation label.
const (
	opConnect      = "connect"
	opPowerState   = "power_state"
	opPowerOn      = "power_on"
	opPowerOff     = "power_off"
	opSoftOff      = "power_off_soft"
	opReset        = "reset"
	opOneTimeBoot  = "one_time_boot"
	opBootOverride = "boot_override"
	opInsertMedia  = "insert_media"
	opEjectMedia   = "eject_media"
)

// Outcomes, the values of the outcome label.
const (
	outcomeOK          = "ok"
	outcomeBusy        = "busy"        // ErrBusy: in a transition, did nothing
	outcomeUnsupported = "unsupported" // ErrUnsupported
	outcomeAuth        = "auth"        // the username or password was rejected
	outcomeTimeout     = "timeout"     // no answer in time
	outcomeError       = "error"       // anything else
)

var (
	operations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "agentboot_bmc_operations_total",
		Help: "BMC operations by operation, protocol (redfish, ipmi) and outcome (ok, busy, unsupported, auth, timeout, error).",
	}, []string{"operation", "protocol", "outcome"})
	latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "agentboot_bmc_operation_seconds",
		Help:    "Time a BMC took to answer, by operation and protocol.",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
	}, []string{"operation", "protocol"})
	registerOnce sync.Once
)

func register() { registerOnce.Do(func() { metrics.Registry.MustRegister(operations, latency) }) }

// observe counts one operation of its outcome and time.
func observe(op, protocol string, start time.Time, err error) {
	operations.WithLabelValues(op, protocol, outcome(err)).Inc()
	latency.WithLabelValues(op, protocol).Observe(time.Since(start).Seconds())
}

func outcome(err error) string {
	switch {
	case err == nil:
		return outcomeOK
	case errors.Is(err, ErrBusy):
		return outcomeBusy
	case errors.Is(err, ErrUnsupported):
		return outcomeUnsupported
	case errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "deadline exceeded") || strings.Contains(err.Error(), "timeout"):
		return outcomeTimeout
	case strings.Contains(err.Error(), "rejected the username or password"):
		return outcomeAuth
	default:
		return outcomeError
	}
}

// measured is a BMC whose every call is counted and timed.
type measured struct {
	BMC
	protocol string
}

func (m measured) PowerState(ctx context.Context) (Power, error) {
	start := time.Now()
	p, err := m.BMC.PowerState(ctx)
	observe(opPowerState, m.protocol, start, err)
	return p, err
}

func (m measured) PowerOn(ctx context.Context) error {
	start := time.Now()
	err := m.BMC.PowerOn(ctx)
	observe(opPowerOn, m.protocol, start, err)
	return err
}

func (m measured) PowerOff(ctx context.Context, soft bool) error {
	start := time.Now()
	err := m.BMC.PowerOff(ctx, soft)
	op := opPowerOff
	if soft {
		op = opSoftOff
	}
	observe(op, m.protocol, start, err)
	return err
}

func (m measured) Reset(ctx context.Context) error {
	start := time.Now()
	err := m.BMC.Reset(ctx)
	observe(opReset, m.protocol, start, err)
	return err
}

func (m measured) SetOneTimeBoot(ctx context.Context, dev Device, efi bool) error {
	start := time.Now()
	err := m.BMC.SetOneTimeBoot(ctx, dev, efi)
	observe(opOneTimeBoot, m.protocol, start, err)
	return err
}

func (m measured) BootOverride(ctx context.Context) (Override, bool, error) {
	start := time.Now()
	ov, ok, err := m.BMC.BootOverride(ctx)
	if ok || err != nil {
		observe(opBootOverride, m.protocol, start, err)
	}
	return ov, ok, err
}

// Virtual media is Redfish's: on IPMI the calls never reach the BMC, and
// are not counted.
func (m measured) InsertMedia(ctx context.Context, url string) error {
	start := time.Now()
	err := m.BMC.InsertMedia(ctx, url)
	if m.protocol == redfish {
		observe(opInsertMedia, m.protocol, start, err)
	}
	return err
}

func (m measured) EjectMedia(ctx context.Context) error {
	start := time.Now()
	err := m.BMC.EjectMedia(ctx)
	if m.protocol == redfish {
		observe(opEjectMedia, m.protocol, start, err)
	}
	return err
}

const redfish = "redfish"
