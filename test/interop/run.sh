#!/usr/bin/env bash
# make interop: isobar's outputs judged by tools that share no code with it
# (docs/interop.md). Each check prints PASS, FAIL or SKIP with a reason;
# the summary counts them and the script fails on any FAIL. A SKIP means a
# tool is not installed (.ci/run installs them); it is counted and listed,
# never silent. Run from the repository root.
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
pass=0 fail=0 skip=0
declare -a skipped failed

ok()   { pass=$((pass+1)); echo "PASS  $1"; }
bad()  { fail=$((fail+1)); failed+=("$1"); echo "FAIL  $1"; }
skp()  { skip=$((skip+1)); skipped+=("$1: $2"); echo "SKIP  $1 ($2)"; }

# ---- Prometheus's own tools ----
if command -v promtool >/dev/null; then
	for f in deploy/prometheus/alerts.yml; do
		if out=$(promtool check rules "$f" 2>&1); then ok "promtool check rules $f ($(grep -o '[0-9]* rules' <<<"$out"))"; else bad "promtool check rules $f"; echo "$out"; fi
	done
	if out=$(cd deploy/prometheus && promtool test rules alerts_test.yml 2>&1); then ok "promtool test rules deploy/prometheus/alerts_test.yml ($(grep -c '^- name:' deploy/prometheus/alerts_test.yml) cases)"; else bad "promtool test rules alerts_test.yml"; echo "$out"; fi
	if out=$(promtool check config deploy/prometheus/prometheus.yml 2>&1); then ok "promtool check config deploy/prometheus/prometheus.yml"; else bad "promtool check config prometheus.yml"; echo "$out"; fi
	out=$(promtool check config deploy/prometheus/prometheus-kubernetes.yml 2>&1)
	if [ $? -eq 0 ]; then ok "promtool check config deploy/prometheus/prometheus-kubernetes.yml"
	elif grep -q 'field kubernetes_sd_configs not found' <<<"$out"; then
		skp "promtool check config prometheus-kubernetes.yml" "this promtool is built without kubernetes_sd (Debian's 2.42 drops the Kubernetes discovery)"
	else bad "promtool check config prometheus-kubernetes.yml"; echo "$out"; fi
	# The judge must be able to fail: a rule that does not parse.
	if out=$(promtool check rules test/interop/testdata/broken_rules.yml 2>&1); then bad "promtool accepted test/interop/testdata/broken_rules.yml"
	else ok "promtool refuses a broken rule file: $(grep -m1 -o 'could not parse.*\|parse error.*' <<<"$out" | head -c 160)"; fi
else
	skp "promtool" "not installed (Debian prometheus)"
fi

# ---- Go-driven judges (xDS clients, etcd 3.4, Kubernetes schemas, container, live Prometheus) ----
if [ -d test/interop/node_modules ] || ! command -v npm >/dev/null; then :; else
	(cd test/interop && npm ci --silent --no-audit --no-fund) || bad "npm ci in test/interop"
fi
log=$(mktemp)
# The judges, and the Go checks that pair with them (metric truth from the
# real registries, the LB policy list, bad-input counters; also in make test).
ISOBAR_INTEROP=1 go test -count=1 -v -timeout 12m ./test/interop/ ./election/ ./deploy/ ./regional/xds/ \
	-run '^(TestXDSJudges|TestXDSJudgesWeightsAndLocalities|TestJudgesRefuseLeastRequestOnly|TestBadADSInput|TestKubernetesSchemas|TestContainerImage|TestLivePrometheus|TestExternalEtcd34|TestGlobalPairExternalEtcd34|TestAlertsAndDashboardNameExportedMetrics|TestMissingMetricsCatchesMistakes|TestEveryAlertHasAPromtoolCase|TestLBPolicyListServesEveryClient|TestOutlierDetectionSuccessRateExplicit|TestBadNonceAndUnknownNamesCountedLoggedOnce)$' >"$log" 2>&1
rc=$?
while read -r line; do
	case "$line" in
	"--- PASS: "*) ok "go ${line#--- PASS: }" ;;
	"--- FAIL: "*) bad "go ${line#--- FAIL: }" ;;
	"--- SKIP: "*) skp "go ${line#--- SKIP: }" "see INTEROP-SKIP above" ;;
	esac
done < <(grep -E '^\s*--- (PASS|FAIL|SKIP): ' "$log" | sed 's/^ *//')
grep -E 'INTEROP-SKIP|INTEROP-KNOWN' "$log" | sed 's/^ */      /' | sort -u
while read -r l; do skp "judge" "${l#*INTEROP-SKIP: }"; done < <(grep -oE 'INTEROP-SKIP: .*' "$log" | sort -u)
grep -E 'SPLIT |FIGURE |DEGRADED |RETRY|NACK-TEXT |JUDGE-FAILS |K8S |ACKS |BADINPUT ' "$log" | sed 's/^ *[a-z0-9_]*\.go:[0-9]*: /      /'
if [ $rc -ne 0 ] && ! grep -q -- '--- FAIL' "$log"; then bad "go test (exit $rc)"; tail -n 40 "$log"; fi
if grep -q -- '--- FAIL' "$log"; then
	echo "---- go test output (failures) ----"
	grep -B2 -A40 -- '--- FAIL' "$log" | head -n 200
	# Under -v a test's messages stream as they happen, long before its
	# --- FAIL line: print the failing tests' own lines (not the helpers'
	# DEBUG and INFO chatter), each after the test it came from.
	echo "---- the failing tests' messages ----"
	awk -v failed="$(grep -oE -- '--- FAIL: [^ ]+' "$log" | cut -d' ' -f3 | tr '\n' ' ')" '
		BEGIN { n = split(failed, a, " "); for (i = 1; i <= n; i++) f[a[i]] = 1 }
		/^=== (RUN|CONT|NAME|PAUSE) / { cur = $3; next }
		(cur in f) && /^[[:space:]]+[A-Za-z0-9_]+\.go:[0-9]+: / && !/helpers_test\.go:[0-9]+: (DEBUG|INFO) / { print cur ": " $0 }
	' "$log" | tail -n 150
fi
rm -f "$log"

end=$(date +%s)
echo
for s in "${skipped[@]+"${skipped[@]}"}"; do echo "  skipped: $s"; done
for f in "${failed[@]+"${failed[@]}"}"; do echo "  FAILED: $f"; done
echo "interop wall time: $((end-start))s"
# Last, the plain count line CI reads.
echo "interop: $pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
