package scale

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"
	"time"

	"github.com/isobar-mesh/isobar/internal/quantile"
)

// quantileNaN is the nearest-rank q-quantile of xs; NaN when empty (the
// report's "not measured").
func quantileNaN(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	return quantile.Of(xs, q)
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func ptr(v float64) *float64 { return &v }

// MarshalJSON writes f's fields in order, as encoding/json would, except
// that a float that is NaN or infinite (a figure not measured, e.g. a
// quantile of no samples) is written null: JSON has no NaN.
func (f Figures) MarshalJSON() ([]byte, error) {
	v := reflect.ValueOf(f)
	t := v.Type()
	var b bytes.Buffer
	b.WriteByte('{')
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q:", name)
		fv := v.Field(i)
		if fv.Kind() == reflect.Float64 && (math.IsNaN(fv.Float()) || math.IsInf(fv.Float(), 0)) {
			b.WriteString("null")
			continue
		}
		if fv.Kind() == reflect.Pointer && !fv.IsNil() && fv.Elem().Kind() == reflect.Float64 &&
			(math.IsNaN(fv.Elem().Float()) || math.IsInf(fv.Elem().Float(), 0)) {
			b.WriteString("null")
			continue
		}
		vb, err := json.Marshal(fv.Interface())
		if err != nil {
			return nil, err
		}
		b.Write(vb)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}
