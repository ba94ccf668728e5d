"""Generates the differential test data of vm/src/template/jinja2/tests.rs.

Run from this directory with Python 3 and Jinja2 3.1 installed: `python3 generate.py`.
python_cases.json: Python's `textwrap.wrap` (as Jinja2's `wordwrap` calls it) and the
`%` operator on random inputs; urlize_cases.json: `jinja2.utils.urlize` on random words.
"""
import json, random, textwrap
random.seed(1)
words = ["a","bb","well-known","long-term","x--y","--","a-b-c","supercalifragilistic","self-evident!","co-op","1-2","ab-12","e-mail,","q?","über-straße","tab\tx","-lead","trail-","---","x-","née-é"]
ww=[]
for i in range(400):
    n=random.randint(0,12)
    s="".join(random.choice(words)+random.choice([" ","  "," ","\t"]) for _ in range(n))
    if random.random()<0.3: s="  "+s
    w=random.randint(1,14)
    blw=random.random()<0.8; boh=random.random()<0.7
    exp="\n".join("\n".join(textwrap.wrap(line,width=w,expand_tabs=False,replace_whitespace=False,break_long_words=blw,break_on_hyphens=boh)) for line in s.splitlines())
    ww.append([s,w,blw,boh,exp])
pc=[]
vals=[0,1,-1,7,255,-255,3.14159,-2.5,0.0001,123456.789,1e20,1e-7,-0.0,1e16,0.5,2.5,99.995,True,"str","é",None]
for i in range(600):
    flags="".join(random.sample("-+ 0#",random.randint(0,3)))
    width=random.choice(["","1","5","12"])
    prec=random.choice(["","",".0",".1",".3",".10"])
    conv=random.choice("sdixXoeEfFgGr")
    v=random.choice(vals)
    fmt="%"+flags+width+prec+conv
    try: r=fmt % (v,)
    except Exception as e: r="ERR"
    pc.append([fmt, v, r])
json.dump({"wordwrap":ww,"percent":pc}, open("python_cases.json","w"), ensure_ascii=False)


# urlize
from jinja2.utils import urlize
random.seed(2)
toks=["http://a.com","https://x.org/p?q=1&r=2","www.foo.net","foo.com","(http://b.io/x)","<www.c.org>","me@x.org","mailto:a@b.cd","@a@b","x@y","tel:123","ftp://z","http://1.2.3.4:8080","http://[::1]","a.b","http://ex.com/a_(b))","www.x.co.uk,","plain","it's","\"q\"","&amp;","https://xn--bcher-kva.example","foo.info.","http://a.b/c.","(www.d.org).","http://e.com/<x>","bar.gov)","sub.domain.edu;"]
out=[]
for i in range(300):
    s=" ".join(random.choice(toks) for _ in range(random.randint(1,5)))
    trim=random.choice([None,None,5,10])
    rel=random.choice([None,"noopener","nofollow noopener"])
    tgt=random.choice([None,"_blank"])
    ex=random.choice([None,["tel:"],["tel:","ftp://"]])
    out.append([s,trim,rel,tgt,ex,urlize(s,trim_url_limit=trim,rel=rel,target=tgt,extra_schemes=ex)])
json.dump(out,open("urlize_cases.json","w"))
