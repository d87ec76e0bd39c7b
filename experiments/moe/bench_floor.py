import csv,sys,json
BW=3.0e12; FL=989e12
L=48; EXP_B=3*768*2048*2; ATT_B=(4096*2048*2+512*2048*2)*2; ROUTER_B=128*2048*2; HEAD_B=151936*2048*2; KV_TOK=L*4*128*2*2
ACTIVE=L*(4096*2048*2+512*2048*2 + 8*3*768*2048 + 128*2048)
def floor_decode(n): 
    e=128*(1-(120/128)**n)
    return (L*(e*EXP_B+ATT_B+ROUTER_B)+HEAD_B)
d=sys.argv[1]
steps=list(csv.DictReader(open(d+"/steps.csv"))); reqs=list(csv.DictReader(open(d+"/requests.csv")))
w=0; t_dec=0; t_pre=0; f_pre=0; ndec=0
for s in steps:
    t=float(s["step_time_ms"])/1e3
    if s["phase"]=="decode": w+=floor_decode(int(s["num_seqs"])); t_dec+=t; ndec+=1
    else:
        n=int(s["num_prefill_tokens"]); f_pre+=2*n*ACTIVE; t_pre+=t
kv=sum((int(r["output_len"])-1)*int(r["prompt_len"])+(int(r["output_len"])-1)*int(r["output_len"])/2 for r in reqs)*KV_TOK
# prefill attention flops (causal, full prompt each request): 4*heads*hd*S^2/2 per layer
att=sum(L*4*32*128*int(r["prompt_len"])**2/2 for r in reqs)
out=sum(int(r["output_len"]) for r in reqs)
fd=(w+kv)/BW; fp=(f_pre+att)/FL
print(f"{d}: {len(reqs)} req, {out} output tok, {ndec} decode steps: measured decode {t_dec:.2f} s vs floor {fd:.2f} s ({t_dec/fd:.2f}x; weights {w/1e9:.0f} GB, KV {kv/1e9:.1f} GB); prefill {t_pre:.3f} s vs FLOP floor {fp:.3f} s ({t_pre/fp:.1f}x); all steps {t_dec+t_pre:.2f} s vs {fd+fp:.2f} s ({(t_dec+t_pre)/(fd+fp):.2f}x); output tok/s at the floor {out/(fd+fp):.0f}")
