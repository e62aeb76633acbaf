package config

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Every value enters koanf in one canonical Go type per kind (string, bool,
// int, float64, time.Duration, []string), whichever source it came from, so
// the final decode needs no weak typing and a wrong type is caught where
// the source and key are still known.

// canonical returns the value of leaf field v in its canonical type; ok is
// false for a nil pointer or a nil slice, which stay unset.
func canonical(k kind, v reflect.Value) (val any, ok bool) {
	if v.Kind() == reflect.Pointer || v.Kind() == reflect.Slice || v.Kind() == reflect.Map {
		if v.IsNil() {
			return nil, false
		}
	}
	switch k {
	case kindString:
		return v.String(), true
	case kindBool:
		return reflect.Indirect(v).Bool(), true
	case kindInt:
		return int(v.Int()), true
	case kindFloat:
		return v.Float(), true
	case kindDuration:
		return time.Duration(v.Int()), true
	case kindStrings:
		out := make([]string, v.Len())
		for i := range out {
			out[i] = v.Index(i).String()
		}
		return out, true
	case kindStringMap:
		out := make(map[string]string, v.Len())
		for _, k := range v.MapKeys() {
			out[k.String()] = v.MapIndex(k).String()
		}
		return out, true
	}
	return nil, false
}

// coerce checks a value read from YAML (or a typed flag value) against kind
// k and returns it in its canonical type. A string where a list is wanted
// is the comma-separated list the flag and the environment take. The error says what was wanted
// and what was found, without the key; the caller adds where.
func coerce(k kind, v any) (any, error) {
	switch k {
	case kindStringMap:
		return coerceStringMap(v)
	case kindString:
		if s, ok := v.(string); ok {
			return s, nil
		}
		return nil, want("a string", v)
	case kindBool:
		if b, ok := v.(bool); ok {
			return b, nil
		}
		return nil, want("true or false", v)
	case kindInt:
		if n, ok := asInt(v); ok {
			return n, nil
		}
		return nil, want("an integer", v)
	case kindFloat:
		if n, ok := asInt(v); ok {
			return float64(n), nil
		}
		switch f := v.(type) {
		case float64:
			return f, nil
		case float32:
			return float64(f), nil
		}
		return nil, want("a number", v)
	case kindDuration:
		switch d := v.(type) {
		case time.Duration:
			return d, nil
		case string:
			parsed, err := time.ParseDuration(d)
			if err != nil {
				return nil, want(`a duration such as "500ms"`, v)
			}
			return parsed, nil
		}
		// A bare 0 is unambiguous; any other bare number has no unit.
		if n, ok := asInt(v); ok && n == 0 {
			return time.Duration(0), nil
		}
		return nil, want(`a duration with a unit such as "500ms"`, v)
	case kindStrings:
		switch list := v.(type) {
		case nil:
			return []string{}, nil
		case string:
			// "labels: full,archive" reads as the flag and the
			// environment read it.
			return splitList(list), nil
		case []string:
			// A flag's comma-separated entries, trimmed as splitList
			// trims the environment's: "--labels 'a, b'" is a and b.
			out := make([]string, len(list))
			for i, e := range list {
				out[i] = strings.TrimSpace(e)
			}
			return out, nil
		case []any:
			out := make([]string, len(list))
			for i, e := range list {
				s, ok := e.(string)
				if !ok {
					return nil, fmt.Errorf("entry %d: %w", i+1, want("a string", e))
				}
				out[i] = s
			}
			return out, nil
		}
		return nil, want("a list of strings", v)
	}
	return nil, fmt.Errorf("unsupported kind %d", k)
}

// parseText parses an environment variable's value for kind k. Lists are
// comma-separated with spaces around entries trimmed; an empty value is an
// empty list.
func parseText(k kind, s string) (any, error) {
	switch k {
	case kindString:
		return s, nil
	case kindBool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return nil, want("true or false", s)
		}
		return b, nil
	case kindInt:
		n, err := strconv.Atoi(s)
		if err != nil {
			return nil, want("an integer", s)
		}
		return n, nil
	case kindFloat:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, want("a number", s)
		}
		return f, nil
	case kindDuration:
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil, want(`a duration such as "500ms"`, s)
		}
		return d, nil
	case kindStrings:
		return splitList(s), nil
	}
	return nil, fmt.Errorf("unsupported kind %d", k)
}

// splitList reads a comma-separated list, with spaces around entries
// trimmed; an empty or blank value is an empty list.
func splitList(s string) []string {
	if strings.TrimSpace(s) == "" {
		return []string{}
	}
	parts := strings.Split(s, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// format renders a leaf value the way the environment would set it.
func format(k kind, v reflect.Value) string {
	val, ok := canonical(k, v)
	if !ok {
		return ""
	}
	switch x := val.(type) {
	case []string:
		return strings.Join(x, ",")
	case map[string]string:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for i, k := range keys {
			keys[i] = k + "=" + x[k]
		}
		return strings.Join(keys, ",")
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	default:
		return fmt.Sprint(x)
	}
}

func asInt(v any) (int, bool) {
	switch n := v.(type) {
	case int:
		return n, true
	case int64:
		if n >= math.MinInt && n <= math.MaxInt {
			return int(n), true
		}
	case uint64:
		if n <= math.MaxInt {
			return int(n), true
		}
	}
	return 0, false
}

func want(what string, got any) error {
	return fmt.Errorf("want %s, got %s", what, describe(got))
}

// describe names a decoded YAML value for an error message.
func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "nothing (null)"
	case string:
		return fmt.Sprintf("string %q", x)
	case bool:
		return fmt.Sprintf("boolean %t", x)
	case int, int64, uint64:
		return fmt.Sprintf("integer %d", x)
	case float64, float32:
		return fmt.Sprintf("number %v", x)
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping"
	default:
		return fmt.Sprintf("%T", v)
	}
}

// coerceStringMap checks a mapping of names to text (a custom type's
// headers or env): every value must be a string, a number or a boolean,
// taken as its text.
func coerceStringMap(v any) (any, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, want("a mapping of names to strings", v)
	}
	out := make(map[string]string, len(m))
	for name, val := range m {
		switch x := val.(type) {
		case string:
			out[name] = x
		case bool, int, int64, uint64, float64:
			out[name] = fmt.Sprint(x)
		default:
			return nil, fmt.Errorf("%s: want a string, got %s", name, describe(val))
		}
	}
	return out, nil
}
