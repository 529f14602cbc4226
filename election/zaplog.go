package election

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// etcdLogger returns the zap logger handed to etcd (embedded server and
// clients): it forwards entries at error level and above to lg as one
// static message, "etcd log", with etcd's own message and fields as
// attributes, and drops everything else. A nil lg gives a no-op logger.
//
// Once quiet is set (the member is being stopped on purpose), entries are
// logged at debug level: etcd reports its own orderly shutdown as errors
// ("setting up serving from embedded etcd failed ... server closed").
func etcdLogger(lg *slog.Logger, quiet *atomic.Bool) *zap.Logger {
	if lg == nil {
		return zap.NewNop()
	}
	return zap.New(&slogCore{lg: lg, min: zapcore.ErrorLevel, quiet: quiet})
}

// slogCore is a zapcore.Core writing to a *slog.Logger.
type slogCore struct {
	lg     *slog.Logger
	min    zapcore.Level
	quiet  *atomic.Bool // may be nil
	fields []zapcore.Field
}

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= c.min }

func (c *slogCore) With(fs []zapcore.Field) zapcore.Core {
	cp := *c
	cp.fields = append(append([]zapcore.Field(nil), c.fields...), fs...)
	return &cp
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fs {
		f.AddTo(enc)
	}
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	attrs := make([]slog.Attr, 0, len(keys)+2)
	attrs = append(attrs, slog.String("etcd_msg", e.Message))
	if e.LoggerName != "" {
		attrs = append(attrs, slog.String("etcd_logger", e.LoggerName))
	}
	for _, k := range keys {
		attrs = append(attrs, slog.Any("etcd_"+snake(k), enc.Fields[k]))
	}
	level := slog.LevelError
	if c.quiet != nil && c.quiet.Load() {
		level = slog.LevelDebug
	}
	c.lg.LogAttrs(context.Background(), level, "etcd log", attrs...)
	return nil
}

func (c *slogCore) Sync() error { return nil }

// snake turns etcd's field names ("local-member-id") into snake_case.
func snake(k string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == '-' || r == ' ' || r == '.':
			return '_'
		case r >= 'A' && r <= 'Z':
			return r + ('a' - 'A')
		}
		return r
	}, k)
}
