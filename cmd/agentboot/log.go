package main

import (
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
)

// newLogger builds the one slog handler every component logs through, and
// points controller-runtime and client-go (klog) at it.
func newLogger(w io.Writer, level, format string) (logr.Logger, error) {
	var lv slog.Level
	switch strings.ToLower(level) {
	case "debug":
		lv = slog.LevelDebug
	case "info", "":
		lv = slog.LevelInfo
	case "warn":
		lv = slog.LevelWarn
	case "error":
		lv = slog.LevelError
	default:
		return logr.Logger{}, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler
	switch format {
	case "text", "":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return logr.Logger{}, fmt.Errorf("--log-format %q: want text or json", format)
	}
	log := logr.FromSlogHandler(h)
	ctrl.SetLogger(log)
	klog.SetLogger(log.WithName("client-go"))
	return log, nil
}
