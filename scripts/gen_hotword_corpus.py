"""Write the hotword corpus (src/ortserve/apps/hotword/data/corpus.tsv) from the lists below.

Deterministic: the same lists give the same file byte for byte; nothing is downloaded. Each
line is one hotword: word, terms (the parts it was built from plus synonyms, for the
tokenizer's dictionary and the index), category, region (province code, 0 national), season
(``holiday:<key>``, ``event:MM-DD:MM-DD`` or empty) and base popularity.

    python scripts/gen_hotword_corpus.py          # rewrite the file
    python scripts/gen_hotword_corpus.py --check  # exit 1 when the file is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "src" / "ortserve" / "apps" / "hotword" / "data" / "corpus.tsv"
HEADER = "word\tterms\tcategory\tregion\tseason\tbase"

# Province-level divisions and their best-known cities (the first is the capital or the city
# itself); codes are the national administrative division codes.
CITIES: dict[int, tuple[str, ...]] = {
    110000: ("北京",), 120000: ("天津",), 130000: ("石家庄", "唐山", "保定", "秦皇岛", "邯郸"),
    140000: ("太原", "大同", "运城"), 150000: ("呼和浩特", "包头", "呼伦贝尔", "鄂尔多斯"),
    210000: ("沈阳", "大连", "鞍山"), 220000: ("长春", "吉林", "延吉"), 230000: ("哈尔滨", "大庆", "齐齐哈尔"),
    310000: ("上海",), 320000: ("南京", "苏州", "无锡", "常州", "南通", "徐州", "扬州"),
    330000: ("杭州", "宁波", "温州", "绍兴", "嘉兴", "金华", "台州"), 340000: ("合肥", "芜湖", "安庆"),
    350000: ("福州", "厦门", "泉州"), 360000: ("南昌", "赣州", "九江", "景德镇"),
    370000: ("济南", "青岛", "烟台", "潍坊", "临沂", "威海"), 410000: ("郑州", "洛阳", "开封", "南阳"),
    420000: ("武汉", "宜昌", "襄阳"), 430000: ("长沙", "株洲", "岳阳"),
    440000: ("广州", "深圳", "东莞", "佛山", "珠海", "汕头", "惠州"), 450000: ("南宁", "桂林", "柳州", "北海"),
    460000: ("海口", "三亚"), 500000: ("重庆",), 510000: ("成都", "绵阳", "乐山", "宜宾"),
    520000: ("贵阳", "遵义"), 530000: ("昆明", "大理", "丽江"), 540000: ("拉萨",),
    610000: ("西安", "宝鸡", "延安"), 620000: ("兰州", "天水"), 630000: ("西宁",), 640000: ("银川",),
    650000: ("乌鲁木齐", "喀什"), 710000: ("台北", "高雄"), 810000: ("香港",), 820000: ("澳门",),
}  # fmt: skip

# Each city's prefecture code (GB/T 2260; 延吉 is filed under 延边州, 222400). Municipalities and
# the SARs keep their province-level code, Taiwan's cities the province's: their hotwords are
# at home for the whole region.
CITY_CODES: dict[str, int] = {"北京": 110000, "天津": 120000, "石家庄": 130100, "唐山": 130200, "保定": 130600, "秦皇岛": 130300, "邯郸": 130400, "太原": 140100, "大同": 140200, "运城": 140800, "呼和浩特": 150100, "包头": 150200, "呼伦贝尔": 150700, "鄂尔多斯": 150600, "沈阳": 210100, "大连": 210200, "鞍山": 210300, "长春": 220100, "吉林": 220200, "延吉": 222400, "哈尔滨": 230100, "大庆": 230600, "齐齐哈尔": 230200, "上海": 310000, "南京": 320100, "苏州": 320500, "无锡": 320200, "常州": 320400, "南通": 320600, "徐州": 320300, "扬州": 321000, "杭州": 330100, "宁波": 330200, "温州": 330300, "绍兴": 330600, "嘉兴": 330400, "金华": 330700, "台州": 331000, "合肥": 340100, "芜湖": 340200, "安庆": 340800, "福州": 350100, "厦门": 350200, "泉州": 350500, "南昌": 360100, "赣州": 360700, "九江": 360400, "景德镇": 360200, "济南": 370100, "青岛": 370200, "烟台": 370600, "潍坊": 370700, "临沂": 371300, "威海": 371000, "郑州": 410100, "洛阳": 410300, "开封": 410200, "南阳": 411300, "武汉": 420100, "宜昌": 420500, "襄阳": 420600, "长沙": 430100, "株洲": 430200, "岳阳": 430600, "广州": 440100, "深圳": 440300, "东莞": 441900, "佛山": 440600, "珠海": 440400, "汕头": 440500, "惠州": 441300, "南宁": 450100, "桂林": 450300, "柳州": 450200, "北海": 450500, "海口": 460100, "三亚": 460200, "重庆": 500000, "成都": 510100, "绵阳": 510700, "乐山": 511100, "宜宾": 511500, "贵阳": 520100, "遵义": 520300, "昆明": 530100, "大理": 532900, "丽江": 530700, "拉萨": 540100, "西安": 610100, "宝鸡": 610300, "延安": 610600, "兰州": 620100, "天水": 620500, "西宁": 630100, "银川": 640100, "乌鲁木齐": 650100, "喀什": 653100, "台北": 710000, "高雄": 710000, "香港": 810000, "澳门": 820000}  # fmt: skip

# City topics: (suffix, its parts, category, popularity).
CITY_TOPICS = (
    ("天气预报", "天气 预报", "生活", 2.0), ("美食推荐", "美食 推荐", "美食", 1.2),
    ("旅游攻略", "旅游 攻略", "旅游", 1.2), ("地铁线路", "地铁 线路", "出行", 0.8),
    ("房价走势", "房价 走势", "房产", 0.8), ("租房信息", "租房 信息", "房产", 0.7),
    ("招聘信息", "招聘 信息", "职场", 0.8), ("公积金查询", "公积金 查询", "民生", 0.6),
    ("社保查询", "社保 查询", "民生", 0.6), ("医院挂号", "医院 挂号", "健康", 0.6),
    ("景点推荐", "景点 推荐", "旅游", 0.9), ("限行规定", "限行 规定", "出行", 0.5),
    ("二手房", "二手房", "房产", 0.5), ("演唱会", "演唱会", "娱乐", 0.6), ("周边游", "周边游", "旅游", 0.6),
    ("夜市小吃", "夜市 小吃", "美食", 0.5), ("人才补贴", "人才 补贴", "职场", 0.4),
    ("落户政策", "落户 政策", "民生", 0.4),
)  # fmt: skip

ATTRACTIONS: dict[int, tuple[str, ...]] = {
    110000: ("故宫", "八达岭长城", "颐和园", "环球影城", "天坛"), 120000: ("天津之眼", "五大道"),
    130000: ("避暑山庄", "北戴河"), 140000: ("平遥古城", "五台山"), 150000: ("呼伦贝尔草原",),
    210000: ("沈阳故宫",), 220000: ("长白山",), 230000: ("冰雪大世界", "中央大街"),
    310000: ("外滩", "迪士尼", "东方明珠"), 320000: ("拙政园", "周庄", "中山陵"),
    330000: ("西湖", "乌镇", "千岛湖"), 340000: ("黄山风景区", "宏村"), 350000: ("鼓浪屿", "武夷山"),
    360000: ("庐山", "婺源"), 370000: ("泰山", "崂山"), 410000: ("少林寺", "龙门石窟"),
    420000: ("黄鹤楼", "东湖"), 430000: ("张家界", "凤凰古城", "橘子洲"), 440000: ("长隆", "广州塔"),
    450000: ("漓江", "阳朔"), 460000: ("蜈支洲岛", "亚龙湾"), 500000: ("洪崖洞", "武隆天坑"),
    510000: ("九寨沟", "峨眉山", "都江堰", "大熊猫基地"), 520000: ("黄果树瀑布",),
    530000: ("丽江古城", "洱海", "玉龙雪山"), 540000: ("布达拉宫", "纳木错"), 610000: ("兵马俑", "华山", "大雁塔"),
    620000: ("莫高窟", "鸣沙山"), 630000: ("青海湖",), 640000: ("沙坡头",), 650000: ("天山天池", "喀纳斯"),
    710000: ("日月潭", "阿里山"), 810000: ("维多利亚港", "海洋公园"), 820000: ("澳门塔", "大三巴"),
}  # fmt: skip
ATTRACTION_TOPICS = (
    ("门票", "门票", 1.0),
    ("攻略", "攻略", 0.8),
    ("预约", "预约", 0.6),
    ("开放时间", "开放 时间", 0.4),
)

# Holidays: key (as in holidays.py), name, synonyms; then topics for every holiday.
HOLIDAYS = (
    ("new_year", "元旦", "新年 跨年"), ("spring", "春节", "过年 新年 年货"), ("qingming", "清明", "清明节 扫墓"),
    ("labour_day", "五一", "劳动节 小长假"), ("dragon_boat", "端午", "端午节 端阳"),
    ("mid_autumn", "中秋", "中秋节 八月十五"), ("national_day", "国庆", "十一 黄金周 国庆节"),
)  # fmt: skip
HOLIDAY_TOPICS = (
    ("放假安排", "放假 安排", 1.5), ("旅游攻略", "旅游 攻略", 1.3), ("高速免费", "高速 免费", 1.0),
    ("出行攻略", "出行 攻略", 0.8), ("酒店预订", "酒店 预订", 0.8), ("机票", "机票", 0.7),
    ("火车票", "火车票", 0.8), ("天气", "天气", 0.6), ("景点推荐", "景点 推荐", 0.8),
    ("祝福语", "祝福语", 0.7), ("加班工资", "加班 工资", 0.5), ("自驾游", "自驾游", 0.5),
    ("去哪玩", "去哪 玩", 0.6), ("堵车", "堵车", 0.4),
)  # fmt: skip
HOLIDAY_SPECIALS = (
    ("春运抢票", "春运 抢票 火车 火车票", "chunyun", 1.5), ("春节联欢晚会", "春晚 联欢晚会 节目", "spring", 1.5),
    ("年夜饭预订", "年夜饭 预订 餐厅", "spring", 1.0), ("春节红包", "红包 春节", "spring", 0.8),
    ("拜年短信", "拜年 短信", "spring", 0.6), ("清明祭扫预约", "祭扫 预约 墓园", "qingming", 0.8),
    ("清明踏青赏花", "踏青 赏花 公园", "qingming", 0.7), ("端午粽子做法", "粽子 做法 口味", "dragon_boat", 1.0),
    ("端午龙舟比赛", "龙舟 比赛 直播", "dragon_boat", 0.7), ("中秋月饼礼盒", "月饼 礼盒 口味", "mid_autumn", 1.2),
    ("中秋赏月地点", "赏月 月亮 团圆", "mid_autumn", 0.7), ("元旦跨年活动", "跨年 活动 倒计时", "new_year", 1.0),
    ("跨年演唱会", "跨年 演唱会 直播", "new_year", 1.2), ("黄金周出行", "黄金周 出行 火车票", "national_day", 1.0),
    ("国庆档电影", "国庆档 电影 票房", "national_day", 0.8), ("五一调休安排", "调休 放假 安排", "labour_day", 1.0),
)  # fmt: skip
HOLIDAY_CITY_TOPICS = (("国庆旅游", "national_day"), ("五一旅游", "labour_day"), ("春节庙会", "spring"))

# Yearly events outside the public holidays: (word, terms, category, MM-DD start, MM-DD end, base).
EVENTS = (
    ("高考报名", "高考 报名", "教育", "11-01", "11-30", 0.6), ("高考作文", "高考 作文", "教育", "06-05", "06-12", 1.2),
    ("高考成绩查询", "高考 成绩 查询", "教育", "06-20", "07-05", 1.5),
    ("高考分数线", "高考 分数线", "教育", "06-20", "07-10", 1.3),
    ("高考志愿填报", "高考 志愿 填报", "教育", "06-22", "07-20", 1.2),
    ("考研报名", "考研 报名", "教育", "10-01", "10-31", 0.8), ("考研成绩查询", "考研 成绩 查询", "教育", "02-20", "03-05", 1.0),
    ("考研国家线", "考研 国家线", "教育", "03-05", "03-20", 0.9), ("考研调剂", "考研 调剂", "教育", "03-15", "04-20", 0.7),
    ("四六级成绩查询", "四六级 成绩 查询", "教育", "08-20", "09-05", 0.8),
    ("国考报名", "国考 报名 公务员", "教育", "10-15", "10-31", 0.8),
    ("双十一预售", "双十一 预售", "购物", "10-20", "11-11", 1.3), ("双十一满减规则", "双十一 满减 规则", "购物", "10-20", "11-11", 1.0),
    ("双十一红包", "双十一 红包", "购物", "10-25", "11-11", 0.9), ("618优惠", "618 优惠", "购物", "05-25", "06-18", 1.0),
    ("618购物节", "618 购物节", "购物", "05-25", "06-18", 0.8), ("年货节", "年货节 年货", "购物", "01-05", "01-25", 0.6),
    ("情人节礼物", "情人节 礼物", "生活", "02-01", "02-14", 1.0), ("情人节餐厅", "情人节 餐厅", "美食", "02-05", "02-14", 0.6),
    ("七夕礼物", "七夕 礼物", "生活", "08-01", "08-20", 0.8), ("圣诞礼物", "圣诞 礼物", "生活", "12-10", "12-25", 0.8),
    ("平安夜", "平安夜 苹果", "生活", "12-20", "12-24", 0.6), ("开学用品", "开学 用品", "教育", "08-15", "09-05", 0.7),
    ("新生报到", "新生 报到", "教育", "08-25", "09-10", 0.6), ("毕业季", "毕业季 毕业", "教育", "06-01", "06-30", 0.6),
    ("个税汇算", "个税 汇算 退税", "财经", "03-01", "06-30", 0.9), ("流感症状", "流感 症状", "健康", "12-01", "02-28", 0.8),
    ("防晒霜推荐", "防晒霜 推荐", "生活", "06-01", "08-31", 0.7), ("空调清洗", "空调 清洗", "生活", "05-20", "07-15", 0.5),
    ("暑假旅游", "暑假 旅游", "旅游", "07-01", "08-25", 1.0), ("暑假兴趣班", "暑假 兴趣班", "教育", "06-25", "07-31", 0.5),
    ("避暑胜地", "避暑 胜地", "旅游", "06-25", "08-20", 0.7), ("滑雪场推荐", "滑雪场 推荐", "旅游", "12-01", "02-28", 0.7),
    ("羽绒服推荐", "羽绒服 推荐", "购物", "11-01", "01-31", 0.7), ("赏樱花", "赏樱花 樱花", "旅游", "03-15", "04-15", 0.7),
    ("苹果发布会", "苹果 发布会", "科技", "09-05", "09-20", 1.0), ("年终奖", "年终奖 奖金", "职场", "12-15", "01-31", 0.7),
    ("NBA季后赛", "NBA 季后赛", "体育", "04-15", "06-20", 0.8), ("欧冠决赛", "欧冠 决赛", "体育", "05-20", "06-05", 0.6),
    ("春季招聘", "春招 招聘", "职场", "02-20", "04-30", 0.6), ("秋季招聘", "秋招 招聘", "职场", "09-01", "10-31", 0.7),
)  # fmt: skip

GENERAL = {
    "科技": "笔记本电脑推荐 平板电脑推荐 蓝牙耳机推荐 智能手表推荐 ChatGPT使用教程 AI绘画 人工智能大模型 "
    "路由器推荐 显卡天梯图 手机壳 充电宝推荐 电脑蓝屏怎么办 微信聊天记录恢复 iPhone价格 iPhone新品",
    "财经": "股市行情 基金净值查询 黄金价格 美元汇率 房贷利率 比特币价格 油价调整 存款利率 A股开盘 人民币汇率 "
    "国债利率 理财产品推荐",
    "娱乐": "电视剧推荐 电影票房排行 综艺节目 热门小说 动漫推荐 短视频剪辑 明星八卦 网络游戏排行 王者荣耀攻略 "
    "原神攻略 电影推荐 纪录片推荐 歌曲排行榜",
    "生活": "天气预报 外卖优惠券 快递查询 美食推荐 减肥食谱 健身计划 家常菜做法 宠物狗品种 装修效果图 "
    "二手车估价 新能源汽车推荐 驾照考试 违章查询 火车票查询 机票查询 高铁时刻表 酒店预订 旅游攻略 "
    "手机话费充值 水电费缴纳 搬家公司 家政保洁",
    "教育": "英语学习方法 小学数学题 作文范文 四六级真题 雅思考试 考公务员 教师资格证 在线课程 编程入门 "
    "Python教程 考研英语 成人自考",
    "健康": "感冒吃什么药 高血压饮食 失眠怎么办 体检套餐 中医养生 牙齿矫正 近视手术 医保报销 核酸检测 "
    "疫苗接种预约",
    "体育": "NBA直播 中超积分榜 马拉松报名 羽毛球拍推荐 跑步鞋推荐 欧冠赛程 世界杯预选赛 乒乓球比赛",
}
GENERAL_POPULAR = {"天气预报": 2.0, "股市行情": 1.5, "外卖优惠券": 1.5, "电视剧推荐": 1.5, "旅游攻略": 1.5}
BRANDS = ("华为", "小米", "苹果", "OPPO", "vivo", "荣耀", "三星")
BRAND_TOPICS = (("手机价格", "手机 价格"), ("新品发布", "新品 发布"), ("手机评测", "手机 评测"))
DISHES = [
    "红烧肉",
    "糖醋排骨",
    "宫保鸡丁",
    "麻婆豆腐",
    "鱼香肉丝",
    "可乐鸡翅",
    "西红柿炒鸡蛋",
    "酸菜鱼",
    "水煮鱼",
    "回锅肉",
    "饺子",
    "包子",
    "蛋糕",
    "面包",
    "红烧排骨",
    "清蒸鲈鱼",
    "土豆丝",
    "凉拌黄瓜",
    "蛋炒饭",
    "牛肉面",
    "小龙虾",
    "火锅底料",
    "卤牛肉",
    "馒头",
    "披萨",
]
CARS = ("比亚迪", "特斯拉", "理想", "蔚来", "小鹏", "问界", "大众", "丰田", "本田", "吉利")

Row = tuple[str, str, str, int, str, float]


def _regional() -> list[Row]:
    rows: list[Row] = []
    for province, cities in CITIES.items():
        for rank, city in enumerate(cities):
            tier = 1.0 if rank == 0 else 0.5
            for suffix, parts, category, base in CITY_TOPICS:
                rows.append((city + suffix, f"{city} {parts}", category, CITY_CODES[city], "", base * tier))
            if rank == 0:
                for topic, holiday in HOLIDAY_CITY_TOPICS:
                    name = dict((k, n) for k, n, _ in HOLIDAYS)[holiday]
                    rows.append(
                        (
                            city + topic,
                            f"{city} {name} {topic[len(name) :]}",
                            "旅游",
                            CITY_CODES[city],
                            f"holiday:{holiday}",
                            0.5,
                        )
                    )
        for place in ATTRACTIONS.get(province, ()):
            for suffix, parts, base in ATTRACTION_TOPICS:
                rows.append((place + suffix, f"{place} {parts}", "旅游", province, "", base))
    return rows


def _seasonal() -> list[Row]:
    rows: list[Row] = []
    for key, name, synonyms in HOLIDAYS:
        for suffix, parts, base in HOLIDAY_TOPICS:
            rows.append((name + suffix, f"{name} {parts} {synonyms}", "节日", 0, f"holiday:{key}", base))
    names = {key: name for key, name, _ in HOLIDAYS} | {"chunyun": "春节"}  # 春运 is 春节's season
    for word, terms, key, base in HOLIDAY_SPECIALS:
        rows.append((word, f"{names[key]} {terms}", "节日", 0, f"holiday:{key}", base))
    for word, terms, category, start, end, base in EVENTS:
        rows.append((word, terms, category, 0, f"event:{start}:{end}", base))
    return rows


def _national() -> list[Row]:
    rows: list[Row] = []
    for category, words in GENERAL.items():
        for word in words.split():
            rows.append((word, word, category, 0, "", GENERAL_POPULAR.get(word, 0.8)))
    for brand in BRANDS:
        for suffix, parts in BRAND_TOPICS:
            rows.append((brand + suffix, f"{brand} {parts}", "科技", 0, "", 0.6))
    for dish in DISHES:
        rows.append((dish + "做法", f"{dish} 做法", "美食", 0, "", 0.5))
    for car in CARS:
        rows.append((car + "汽车报价", f"{car} 汽车 报价", "汽车", 0, "", 0.5))
    return rows


def corpus_text() -> str:
    """The whole file; a word listed twice keeps its first row."""
    seen: set[str] = set()
    lines = [HEADER]
    for word, terms, category, region, season, base in _seasonal() + _regional() + _national():
        if word not in seen:
            seen.add(word)
            lines.append(f"{word}\t{terms}\t{category}\t{region}\t{season}\t{base:.2f}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail when the file differs")
    args = parser.parse_args()
    text = corpus_text()
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is stale: run scripts/gen_hotword_corpus.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    print(f"{OUT}: {text.count(chr(10)) - 1} hotwords, {len(text.encode())} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
