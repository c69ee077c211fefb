# Sourced by the measurement scripts of tests/decisive/: the verdict and reason of a `check --json` report.
verdict_of() {  # json file -> verdict and reason (one line)
    /usr/bin/python3 -c 'import json,sys
try:
    j=json.load(open(sys.argv[1])); print(j["verdict"]+"\t"+j.get("reason","").replace("\t"," ")[:200])
except Exception as e: print("ERROR\t"+str(e)[:200])' "$1"
}
